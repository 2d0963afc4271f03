/* A program that creates its workers per phase (fork-join), as many benchmark programs do:
 * phase 0's two workers are what the migration point sees; phases 1 .. PHASES-1 create two
 * new workers each, after the migration, which compute about as long and then exit. Each
 * worker sums its own slice of a shared array; main checks the sums and prints them per phase.
 * Usage: late_threads [PHASES] (default 3). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define N (1L << 21)
static unsigned long data[N];
static unsigned long sums[2];

struct job {
  long k;
  int phase;
};

static void* worker(void* arg) {
  const struct job* j = arg;
  unsigned long s = 0;
  for (int rep = 0; rep < 1000; rep++) {
    for (long i = j->k * (N / 2); i < (j->k + 1) * (N / 2); i++) s += data[i] * (unsigned long)(rep + j->phase);
  }
  sums[j->k] = s;
  return NULL;
}

int main(int argc, char** argv) {
  const int phases = argc > 1 ? atoi(argv[1]) : 3;
  for (long i = 0; i < N; i++) data[i] = (unsigned long)(i * 2654435761u) % 1000;
  for (int p = 0; p < phases; p++) {
    pthread_t t[2];
    struct job jobs[2] = {{0, p}, {1, p}};
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, worker, &jobs[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    printf("phase %d: %lu %lu\n", p, sums[0], sums[1]);
  }
  return 0;
}
