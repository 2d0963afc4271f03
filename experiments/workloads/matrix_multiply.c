/* Matrix multiply (Phoenix): C = A x B for N x N int matrices; workers take row blocks of C.
 * --size = N. */
#include <stdio.h>
#include <stdlib.h>

#include "common.h"

typedef struct {
  const int *a, *b;
  int* c;
  long n;
} job;

static void multiply(int w, int nw, void* p) {
  job* j = p;
  long rb, re, n = j->n;
  wl_slice(n, w, nw, &rb, &re);
  for (long i = rb; i < re; ++i) {
    int* crow = j->c + i * n;
    for (long k = 0; k < n; ++k) crow[k] = 0;
    for (long k = 0; k < n; ++k) {
      int aik = j->a[i * n + k];
      const int* brow = j->b + k * n;
      for (long col = 0; col < n; ++col) crow[col] += aik * brow[col];
    }
  }
}

int main(int argc, char** argv) {
  wl_args a;
  wl_parse(argc, argv, &a, 512, 1,
           "[--threads=N] [--size=N] [--seed=N] [--pin] [--per_phase] [--manual]");
  double t0 = wl_now_ms();
  long n = a.size;
  int* ma = wl_alloc(sizeof(int) * (size_t)(n * n));
  int* mb = wl_alloc(sizeof(int) * (size_t)(n * n));
  int* mc = wl_alloc(sizeof(int) * (size_t)(n * n));
  uint64_t s = a.seed;
  for (long i = 0; i < n * n; ++i) ma[i] = (int)(wl_rand(&s) % 64);
  for (long i = 0; i < n * n; ++i) mb[i] = (int)(wl_rand(&s) % 64);
  /* With --manual the job lives in shared memory too: workers on other nodes read it. */
  job* j = wl_alloc(sizeof(job));
  j->a = ma;
  j->b = mb;
  j->c = mc;
  j->n = n;
  wl_report_time("generate", t0);

  wl_pool* pool = a.per_phase ? NULL : wl_pool_start(&a);
  double t1 = wl_now_ms();
  wl_phase(&a, pool, multiply, j);
  wl_report_time("compute", t1);
  wl_pool_stop(pool);

  unsigned long long sum = 0, hash = 1469598103934665603ull;
  for (long i = 0; i < n * n; ++i) {
    sum += (unsigned)mc[i];
    hash = (hash ^ (unsigned)mc[i]) * 1099511628211ull;
  }
  printf("n=%ld sum=%llu hash=%016llx c[0][0]=%d c[n-1][n-1]=%d\n", n, sum, hash, mc[0],
         mc[n * n - 1]);
  wl_free(ma);
  wl_free(mb);
  wl_free(mc);
  wl_free(j);
  return 0;
}
