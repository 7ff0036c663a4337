#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
int main(int argc,char**argv){
  MPI_Init(&argc,&argv); int r; MPI_Comm_rank(MPI_COMM_WORLD,&r);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int sizes[][2]={{16,4041},{16,4043},{16,4045},{16,4047}};
  for(int k=0;k<4;k++){
    int posted=sizes[k][0], sent=sizes[k][1];
    if(r==1){ char*b=malloc(sent); memset(b,7,sent); MPI_Request q; MPI_Isend(b,sent,MPI_BYTE,0,5,MPI_COMM_WORLD,&q); MPI_Status s; int e=MPI_Wait(&q,&s); printf("send %d: %d\n",sent,e); free(b);}
    else { char*b=malloc(posted+sent); memset(b,0,posted+sent); MPI_Request q; MPI_Irecv(b,posted,MPI_BYTE,1,5,MPI_COMM_WORLD,&q); MPI_Status s; int e=MPI_Wait(&q,&s); int over=0; for(int i=posted;i<posted+sent;i++) if(b[i]) over++; int c; MPI_Get_count(&s,MPI_BYTE,&c); printf("posted %d sent %d: err %d status err %d count %d overwritten past end %d\n",posted,sent,e,s.MPI_ERROR,c,over); free(b);}
    MPI_Barrier(MPI_COMM_WORLD);
  }
  MPI_Finalize();
}
