/* Linear regression (Phoenix): fits y = a + b x to byte-valued points. Each worker sums its
 * slice into private 64-bit accumulators; main combines them. --size = points. */
#include <stdio.h>
#include <stdlib.h>

#include "common.h"

typedef struct {
  long long sx, sy, sxx, syy, sxy;
  char pad[4096 - 5 * sizeof(long long)]; /* one page per worker, as separate allocations */
} sums;

typedef struct {
  const uint8_t* xy; /* n pairs */
  long n;
  sums* out;
} job;

static void fit(int w, int nw, void* p) {
  job* j = p;
  long b, e;
  wl_slice(j->n, w, nw, &b, &e);
  long long sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;
  for (long i = b; i < e; ++i) {
    long long x = j->xy[2 * i], y = j->xy[2 * i + 1];
    sx += x;
    sy += y;
    sxx += x * x;
    syy += y * y;
    sxy += x * y;
  }
  j->out[w] = (sums){sx, sy, sxx, syy, sxy, {0}};
}

int main(int argc, char** argv) {
  wl_args a;
  wl_parse(argc, argv, &a, 1L << 24, 1,
           "[--threads=N] [--size=POINTS] [--seed=N] [--pin] [--per_phase]");
  double t0 = wl_now_ms();
  uint8_t* xy = wl_alloc(2 * (size_t)a.size);
  uint64_t s = a.seed;
  for (long i = 0; i < a.size; ++i) {
    uint64_t r = wl_rand(&s);
    int x = (int)(r & 0xFF);
    int noise = (int)((r >> 8) % 41) - 20;
    int y = 30 + x * 2 / 3 + noise;
    xy[2 * i] = (uint8_t)x;
    xy[2 * i + 1] = (uint8_t)(y < 0 ? 0 : y > 255 ? 255 : y);
  }
  job j = {xy, a.size, NULL};
  j.out = aligned_alloc(4096, sizeof(sums) * (size_t)a.threads);
  wl_report_time("generate", t0);

  wl_pool* pool = a.per_phase ? NULL : wl_pool_start(&a);
  double t1 = wl_now_ms();
  wl_phase(&a, pool, fit, &j);
  long long sx = 0, sy = 0, sxx = 0, syy = 0, sxy = 0;
  for (int w = 0; w < a.threads; ++w) {
    sx += j.out[w].sx;
    sy += j.out[w].sy;
    sxx += j.out[w].sxx;
    syy += j.out[w].syy;
    sxy += j.out[w].sxy;
  }
  wl_report_time("compute", t1);
  wl_pool_stop(pool);

  double n = (double)a.size;
  double b = (n * sxy - (double)sx * sy) / (n * sxx - (double)sx * sx);
  double a0 = (sy - b * sx) / n;
  double r = (n * sxy - (double)sx * sy) /
             __builtin_sqrt((n * sxx - (double)sx * sx) * (n * syy - (double)sy * sy));
  printf("points: %ld\nsums: sx=%lld sy=%lld sxx=%lld syy=%lld sxy=%lld\n", a.size, sx, sy, sxx,
         syy, sxy);
  printf("a=%.6f b=%.6f xbar=%.6f ybar=%.6f r2=%.6f\n", a0, b, sx / n, sy / n, r * r);
  free(xy);
  free(j.out);
  return 0;
}
