/* MPI_Bcast of 4, 16 and 64 MiB on raw Open MPI, whole or as a loop of 256 KiB, 1 MiB or 4 MiB
 * broadcasts (medians of 15, in µs): whether pieces that fit the caches move faster.
 *     mpicc -O2 bench/results/epyc/2026-11-29-ddp-bound/mpi_bcast_pieces.c -o bc && mpirun -np 2 ./bc */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int c,char**v){MPI_Init(&c,&v);int r;MPI_Comm_rank(MPI_COMM_WORLD,&r);
 size_t sizes[]={4<<20,16<<20,64<<20}; size_t pieces[]={0,256<<10,1<<20,4<<20};
 for(int si=0;si<3;si++){size_t S=sizes[si];char*b=aligned_alloc(4096,S);memset(b,r,S);
  int reps=15; double t[4][64];
  for(int it=0;it<reps;it++) for(int m=0;m<4;m++){
    size_t P=pieces[m]?pieces[m]:S;
    MPI_Barrier(MPI_COMM_WORLD);double s=MPI_Wtime();
    for(size_t o=0;o<S;o+=P) MPI_Bcast(b+o,(int)(P<S-o?P:S-o),MPI_BYTE,0,MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD); t[m][it]=(MPI_Wtime()-s)*1e6; }
  for(int m=0;m<4;m++)qsort(t[m],reps,sizeof(double),cmp);
  if(r==0)printf("%zu MiB: whole %.0f | 256K pieces %.0f | 1M pieces %.0f | 4M pieces %.0f us\n",S>>20,t[0][reps/2],t[1][reps/2],t[2][reps/2],t[3][reps/2]);
  free(b);}
 MPI_Finalize();}
