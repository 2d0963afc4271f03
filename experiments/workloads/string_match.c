/* String match (Phoenix): hashes every word of a word list with an iterated hash (Phoenix
 * "encrypts" each key) and reports which words match four target keys. Workers scan slices of
 * the list and record matches in private arrays. --size = words. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define WORD_MAX 12
#define ROUNDS 16

static const char* kTargets[4] = {"helloworld", "howareyou", "ferrari", "whotheman"};

static uint64_t digest(const char* w) {
  uint64_t h = 1469598103934665603ull;
  for (int r = 0; r < ROUNDS; ++r) {
    for (const char* c = w; *c; ++c) h = (h ^ (uint8_t)*c) * 1099511628211ull;
    h ^= h >> 29;
  }
  return h;
}

typedef struct {
  const char* words; /* n entries of WORD_MAX bytes, NUL-terminated */
  long n;
  uint64_t target[4];
  long* found[1024]; /* per worker: indices of matches, -1 terminated; target in the low bits */
} job;

static void scan(int w, int nw, void* p) {
  job* j = p;
  long b, e, cap = 16, used = 0;
  long* out = malloc(sizeof(long) * (size_t)cap);
  wl_slice(j->n, w, nw, &b, &e);
  for (long i = b; i < e; ++i) {
    uint64_t h = digest(j->words + i * WORD_MAX);
    for (int t = 0; t < 4; ++t) {
      if (h != j->target[t]) continue;
      if (used + 2 >= cap) out = realloc(out, sizeof(long) * (size_t)(cap *= 2));
      out[used++] = i * 4 + t;
    }
  }
  out[used] = -1;
  j->found[w] = out;
}

int main(int argc, char** argv) {
  wl_args a;
  wl_parse(argc, argv, &a, 1L << 20, 1,
           "[--threads=N] [--size=WORDS] [--seed=N] [--pin] [--per_phase]");
  double t0 = wl_now_ms();
  char* words = wl_alloc((size_t)a.size * WORD_MAX);
  uint64_t s = a.seed;
  for (long i = 0; i < a.size; ++i) {
    char* w = words + i * WORD_MAX;
    uint64_t r = wl_rand(&s);
    if (r % 50000 == 0) {
      strcpy(w, kTargets[(r >> 20) % 4]);
      continue;
    }
    int len = 3 + (int)(r % 8);
    for (int k = 0; k < len; ++k) w[k] = (char)('a' + (wl_rand(&s) % 26));
    w[len] = '\0';
  }
  job j = {words, a.size, {0}, {0}};
  for (int t = 0; t < 4; ++t) j.target[t] = digest(kTargets[t]);
  wl_report_time("generate", t0);

  wl_pool* pool = a.per_phase ? NULL : wl_pool_start(&a);
  double t1 = wl_now_ms();
  wl_phase(&a, pool, scan, &j);
  wl_report_time("compute", t1);
  wl_pool_stop(pool);

  long count[4] = {0}, first[4] = {-1, -1, -1, -1};
  for (int w = 0; w < a.threads; ++w) {
    for (long* f = j.found[w]; *f >= 0; ++f) {
      int t = (int)(*f % 4);
      if (first[t] < 0) first[t] = *f / 4;
      count[t]++;
    }
    free(j.found[w]);
  }
  for (int t = 0; t < 4; ++t) {
    printf("%s: matches=%ld first=%ld\n", kTargets[t], count[t], first[t]);
  }
  free(words);
  return 0;
}
