/* Word count (Phoenix): counts word frequencies in a text and prints the most frequent words.
 * Each worker counts its slice (cut at word boundaries) into a private hash table; main
 * merges them. The text is drawn from a Zipf-like vocabulary. --size = words. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define TOP 10

typedef struct {
  char* word;
  long count;
} entry;

typedef struct {
  entry* slots;
  long cap, used;
} table;

static uint64_t hash_str(const char* s, long len) {
  uint64_t h = 1469598103934665603ull;
  for (long i = 0; i < len; ++i) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
  return h;
}

static void table_add(table* t, const char* w, long len, long n) {
  if (2 * (t->used + 1) > t->cap) {
    table bigger = {calloc((size_t)(t->cap * 2), sizeof(entry)), t->cap * 2, 0};
    for (long i = 0; i < t->cap; ++i) {
      if (t->slots[i].word)
        table_add(&bigger, t->slots[i].word, (long)strlen(t->slots[i].word), t->slots[i].count);
      free(t->slots[i].word);
    }
    free(t->slots);
    *t = bigger;
  }
  long i = (long)(hash_str(w, len) & (uint64_t)(t->cap - 1));
  while (t->slots[i].word &&
         (strncmp(t->slots[i].word, w, (size_t)len) || t->slots[i].word[len] != '\0')) {
    i = (i + 1) & (t->cap - 1);
  }
  if (!t->slots[i].word) {
    t->slots[i].word = strndup(w, (size_t)len);
    t->used++;
  }
  t->slots[i].count += n;
}

typedef struct {
  const char* text;
  long len;
  table* tables[1024];
} job;

static void count(int w, int nw, void* p) {
  job* j = p;
  long b, e;
  wl_slice(j->len, w, nw, &b, &e);
  /* A word belongs to the slice where it starts. */
  if (b > 0) {
    while (b < j->len && j->text[b - 1] != ' ') ++b;
  }
  table* t = malloc(sizeof(table));
  *t = (table){calloc(1024, sizeof(entry)), 1024, 0};
  long i = b;
  while (i < e) {
    while (i < j->len && j->text[i] == ' ') ++i;
    if (i >= e) break;
    long s = i;
    while (i < j->len && j->text[i] != ' ') ++i;
    table_add(t, j->text + s, i - s, 1);
  }
  j->tables[w] = t;
}

static int by_count(const void* x, const void* y) {
  const entry *a = x, *b = y;
  if (a->count != b->count) return a->count > b->count ? -1 : 1;
  return strcmp(a->word, b->word);
}

int main(int argc, char** argv) {
  wl_args a;
  wl_parse(argc, argv, &a, 1L << 21, 1,
           "[--threads=N] [--size=WORDS] [--seed=N] [--pin] [--per_phase]");
  double t0 = wl_now_ms();
  /* Vocabulary of 5000 words; word k drawn with probability ~ 1/(k+1) (Zipf). */
  enum { VOCAB = 5000 };
  static char vocab[VOCAB][12];
  uint64_t s = a.seed;
  for (int k = 0; k < VOCAB; ++k) {
    int len = 2 + (int)(wl_rand(&s) % 9);
    for (int c = 0; c < len; ++c) vocab[k][c] = (char)('a' + wl_rand(&s) % 26);
    vocab[k][len] = '\0';
  }
  static double cdf[VOCAB];
  double total = 0;
  for (int k = 0; k < VOCAB; ++k) cdf[k] = (total += 1.0 / (k + 1));
  char* text = wl_alloc((size_t)a.size * 12 + 1);
  long len = 0;
  for (long i = 0; i < a.size; ++i) {
    double u = (double)(wl_rand(&s) >> 11) / 9007199254740992.0 * total;
    long lo = 0, hi = VOCAB - 1;
    while (lo < hi) {
      long mid = (lo + hi) / 2;
      if (cdf[mid] < u)
        lo = mid + 1;
      else
        hi = mid;
    }
    size_t l = strlen(vocab[lo]);
    memcpy(text + len, vocab[lo], l);
    len += (long)l;
    text[len++] = ' ';
  }
  text[len] = '\0';
  job j = {text, len, {0}};
  wl_report_time("generate", t0);

  wl_pool* pool = a.per_phase ? NULL : wl_pool_start(&a);
  double t1 = wl_now_ms();
  wl_phase(&a, pool, count, &j);
  table merged = {calloc(8192, sizeof(entry)), 8192, 0};
  long words = 0;
  for (int w = 0; w < a.threads; ++w) {
    table* t = j.tables[w];
    for (long i = 0; i < t->cap; ++i) {
      if (!t->slots[i].word) continue;
      table_add(&merged, t->slots[i].word, (long)strlen(t->slots[i].word), t->slots[i].count);
      words += t->slots[i].count;
      free(t->slots[i].word);
    }
    free(t->slots);
    free(t);
  }
  entry* all = wl_alloc(sizeof(entry) * (size_t)merged.used);
  long m = 0;
  for (long i = 0; i < merged.cap; ++i) {
    if (merged.slots[i].word) all[m++] = merged.slots[i];
  }
  qsort(all, (size_t)m, sizeof(entry), by_count);
  wl_report_time("compute", t1);
  wl_pool_stop(pool);

  printf("words: %ld distinct: %ld\n", words, m);
  for (long i = 0; i < m && i < TOP; ++i) printf("%s: %ld\n", all[i].word, all[i].count);
  for (long i = 0; i < merged.cap; ++i) free(merged.slots[i].word);
  free(merged.slots);
  free(all);
  free(text);
  return 0;
}
