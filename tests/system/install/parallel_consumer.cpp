// Built against the installed backplane::parallel: one call into the frontend, so the link is real.
#include <backplane/parallel/utils.h>

#include <cstdio>

int main() {
  std::printf("cpu_mode=%d\n", backplane::parallel::cpu_mode() ? 1 : 0);
  return 0;
}
