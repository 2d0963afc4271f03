/* PCA (Phoenix): for a ROWS x COLS int matrix, computes each row's mean (phase 1) and the
 * ROWS x ROWS covariance matrix (phase 2, workers take rows of the upper triangle). Integer
 * arithmetic makes the result independent of the thread count. --size = ROWS (COLS = 4 ROWS). */
#include <stdio.h>
#include <stdlib.h>

#include "common.h"

typedef struct {
  const int* m;
  long rows, cols;
  long long* mean;
  long long* cov; /* rows x rows */
} job;

static void means(int w, int nw, void* p) {
  job* j = p;
  long b, e;
  wl_slice(j->rows, w, nw, &b, &e);
  for (long r = b; r < e; ++r) {
    long long s = 0;
    for (long c = 0; c < j->cols; ++c) s += j->m[r * j->cols + c];
    j->mean[r] = s / j->cols;
  }
}

static void covariance(int w, int nw, void* p) {
  job* j = p;
  /* Row i of the upper triangle has rows-i entries: interleave rows so work is balanced. */
  for (long i = w; i < j->rows; i += nw) {
    const int* ri = j->m + i * j->cols;
    for (long k = i; k < j->rows; ++k) {
      const int* rk = j->m + k * j->cols;
      long long s = 0;
      for (long c = 0; c < j->cols; ++c) s += (ri[c] - j->mean[i]) * (rk[c] - j->mean[k]);
      j->cov[i * j->rows + k] = s / (j->cols - 1);
    }
  }
}

int main(int argc, char** argv) {
  wl_args a;
  wl_parse(argc, argv, &a, 256, 1, "[--threads=N] [--size=ROWS] [--seed=N] [--pin] [--per_phase]");
  double t0 = wl_now_ms();
  job j;
  j.rows = a.size;
  j.cols = 4 * a.size;
  int* m = wl_alloc(sizeof(int) * (size_t)(j.rows * j.cols));
  uint64_t s = a.seed;
  for (long i = 0; i < j.rows * j.cols; ++i) m[i] = (int)(wl_rand(&s) % 1000);
  j.m = m;
  j.mean = wl_alloc(sizeof(long long) * (size_t)j.rows);
  j.cov = wl_alloc(sizeof(long long) * (size_t)(j.rows * j.rows));
  wl_report_time("generate", t0);

  wl_pool* pool = a.per_phase ? NULL : wl_pool_start(&a);
  double t1 = wl_now_ms();
  wl_phase(&a, pool, means, &j);
  wl_phase(&a, pool, covariance, &j);
  wl_report_time("compute", t1);
  wl_pool_stop(pool);

  long long trace = 0;
  unsigned long long hash = 1469598103934665603ull;
  for (long i = 0; i < j.rows; ++i) {
    trace += j.cov[i * j.rows + i];
    for (long k = i; k < j.rows; ++k) {
      hash = (hash ^ (unsigned long long)j.cov[i * j.rows + k]) * 1099511628211ull;
    }
  }
  printf("rows=%ld cols=%ld mean[0]=%lld trace=%lld cov[0][1]=%lld hash=%016llx\n", j.rows, j.cols,
         j.mean[0], trace, j.rows > 1 ? j.cov[1] : 0, hash);
  free(m);
  free(j.mean);
  free(j.cov);
  return 0;
}
