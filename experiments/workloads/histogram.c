/* Histogram (Phoenix): counts the red, green and blue values of a 24-bit image. Each worker
 * fills private histograms for its slice of pixels; main merges them. --size = pixels. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

typedef struct {
  const uint8_t* pixels;
  long npixels;
  uint64_t* hist[1024]; /* per worker: 3 x 256 counters, allocated by the worker */
} job;

static void count(int w, int n, void* p) {
  job* j = p;
  uint64_t* h = calloc(3 * 256, sizeof(uint64_t));
  long b, e;
  wl_slice(j->npixels, w, n, &b, &e);
  for (long i = b; i < e; ++i) {
    const uint8_t* px = j->pixels + 3 * i;
    h[px[2]]++; /* BMP stores blue, green, red */
    h[256 + px[1]]++;
    h[512 + px[0]]++;
  }
  j->hist[w] = h;
}

int main(int argc, char** argv) {
  wl_args a;
  wl_parse(argc, argv, &a, 1L << 22, 1,
           "[--threads=N] [--size=PIXELS] [--seed=N] [--pin] [--per_phase]");
  double t0 = wl_now_ms();
  job j = {0};
  j.npixels = a.size;
  uint8_t* px = wl_alloc((size_t)a.size * 3);
  uint64_t s = a.seed;
  for (long i = 0; i < a.size * 3; i += 8) {
    uint64_t r = wl_rand(&s);
    for (int k = 0; k < 8 && i + k < a.size * 3; ++k) px[i + k] = (uint8_t)(r >> (8 * k));
  }
  /* Skew the colours so the histogram is not flat. */
  for (long i = 0; i < a.size; ++i) px[3 * i] = (uint8_t)(px[3 * i] / 2 + px[3 * i + 1] / 4);
  j.pixels = px;
  wl_report_time("generate", t0);

  wl_pool* pool = a.per_phase ? NULL : wl_pool_start(&a);
  double t1 = wl_now_ms();
  wl_phase(&a, pool, count, &j);
  uint64_t total[3 * 256] = {0};
  for (int w = 0; w < a.threads; ++w) {
    for (int k = 0; k < 3 * 256; ++k) total[k] += j.hist[w][k];
    free(j.hist[w]);
  }
  wl_report_time("compute", t1);
  wl_pool_stop(pool);

  const char* names[3] = {"red", "green", "blue"};
  for (int c = 0; c < 3; ++c) {
    uint64_t sum = 0, hash = 1469598103934665603ull, max = 0;
    int argmax = 0;
    for (int v = 0; v < 256; ++v) {
      uint64_t x = total[256 * c + v];
      sum += x;
      hash = (hash ^ x) * 1099511628211ull;
      if (x > max) {
        max = x;
        argmax = v;
      }
    }
    printf("%s: pixels=%llu mode=%d count=%llu hash=%016llx\n", names[c], (unsigned long long)sum,
           argmax, (unsigned long long)max, (unsigned long long)hash);
  }
  free(px);
  return 0;
}
