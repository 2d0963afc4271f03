/* K-means (Phoenix): clusters integer points in DIM dimensions. Each iteration has two phases,
 * as in Phoenix's pthread version: workers assign their slice of points to the nearest mean
 * (writing the shared assignment array and a shared "modified" flag), then compute new means
 * for their share of the clusters by scanning all points (writing the shared means array).
 * Integer arithmetic makes the result independent of the thread count.
 * --size = points, --iterations = maximum iterations. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>

#include "common.h"

#define DIM 3
#define K 16
#define GRID 1000

typedef struct {
  int* points; /* n x DIM */
  long n;
  int* assignment;
  int means[K][DIM];
  volatile int modified;
} job;

static void assign(int w, int nw, void* p) {
  job* j = p;
  long b, e;
  wl_slice(j->n, w, nw, &b, &e);
  for (long i = b; i < e; ++i) {
    const int* pt = j->points + DIM * i;
    long best = LONG_MAX;
    int best_k = 0;
    for (int k = 0; k < K; ++k) {
      long d = 0;
      for (int c = 0; c < DIM; ++c) {
        long x = pt[c] - j->means[k][c];
        d += x * x;
      }
      if (d < best) {
        best = d;
        best_k = k;
      }
    }
    if (j->assignment[i] != best_k) {
      j->assignment[i] = best_k;
      j->modified = 1;
    }
  }
}

static void recompute(int w, int nw, void* p) {
  job* j = p;
  long b, e;
  wl_slice(K, w, nw, &b, &e);
  for (long k = b; k < e; ++k) {
    long sum[DIM] = {0}, count = 0;
    for (long i = 0; i < j->n; ++i) {
      if (j->assignment[i] != k) continue;
      for (int c = 0; c < DIM; ++c) sum[c] += j->points[DIM * i + c];
      count++;
    }
    if (count > 0) {
      for (int c = 0; c < DIM; ++c) j->means[k][c] = (int)(sum[c] / count);
    }
  }
}

int main(int argc, char** argv) {
  wl_args a;
  wl_parse(argc, argv, &a, 100000, 50,
           "[--threads=N] [--size=POINTS] [--iterations=MAX] [--seed=N] [--pin] [--per_phase] "
           "[--manual]");
  double t0 = wl_now_ms();
  /* With --manual the job (means, flag) lives in shared memory: workers on other nodes write it. */
  job* j = wl_alloc(sizeof(job));
  j->n = a.size;
  j->points = wl_alloc(sizeof(int) * DIM * (size_t)a.size);
  j->assignment = wl_alloc(sizeof(int) * (size_t)a.size);
  uint64_t s = a.seed;
  /* Points scattered around K hidden centres, so the clustering has structure to find. */
  int centre[K][DIM];
  for (int k = 0; k < K; ++k) {
    for (int c = 0; c < DIM; ++c) centre[k][c] = 100 + (int)(wl_rand(&s) % (GRID - 200));
  }
  for (long i = 0; i < a.size; ++i) {
    int k = (int)(wl_rand(&s) % K);
    for (int c = 0; c < DIM; ++c) {
      j->points[DIM * i + c] = centre[k][c] + (int)(wl_rand(&s) % 121) - 60;
    }
  }
  for (long i = 0; i < a.size; ++i) j->assignment[i] = -1;
  for (int k = 0; k < K; ++k) {
    for (int c = 0; c < DIM; ++c) j->means[k][c] = j->points[DIM * (k * (a.size / K)) + c];
  }
  wl_report_time("generate", t0);

  wl_pool* pool = a.per_phase ? NULL : wl_pool_start(&a);
  double t1 = wl_now_ms();
  int iter = 0;
  do {
    j->modified = 0;
    wl_phase(&a, pool, assign, j);
    wl_phase(&a, pool, recompute, j);
    iter++;
  } while (j->modified && iter < a.iterations);
  wl_report_time("compute", t1);
  wl_pool_stop(pool);

  printf("iterations: %d converged: %s\n", iter, j->modified ? "no" : "yes");
  for (int k = 0; k < K; ++k) {
    long members = 0;
    for (long i = 0; i < j->n; ++i) members += j->assignment[i] == k;
    printf("cluster %2d: mean (%d, %d, %d) members %ld\n", k, j->means[k][0], j->means[k][1],
           j->means[k][2], members);
  }
  wl_free(j->points);
  wl_free(j->assignment);
  wl_free(j);
  return 0;
}
