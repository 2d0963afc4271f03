/* An OpenMP program in libgomp's usual shape: the master thread works inside every parallel
 * region, the workers spin and then futex-wait between regions, nobody calls pthread_join.
 * Prints a sum over all rounds. Usage: omp_master_computes [ROUNDS] [N]. */
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? atoi(argv[1]) : 40;
  const long n = argc > 2 ? atol(argv[2]) : 4000000;
  double* a = malloc(n * sizeof(double));
  double total = 0;
  for (int r = 0; r < rounds; r++) {
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
      double x = (double)(i % 1000) + r;
      for (int k = 0; k < 8; k++) x = x * 0.5 + 1.0;
      a[i] = x;
    }
    double s = 0;
#pragma omp parallel for schedule(static) reduction(+ : s)
    for (long i = 0; i < n; i++) s += a[i];
    total += s;
  }
  printf("%.6e\n", total);
  free(a);
  return 0;
}
