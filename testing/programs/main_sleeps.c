/* Two workers compute while the main thread sleeps in nanosleep() and polls a counter, never
 * blocking in a futex (so the only migration point is the workers' activity). Prints both
 * workers' results. Usage: main_sleeps [ITERATIONS] (default 800 million per worker). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static atomic_int done;
static long iterations = 800000000L;
static unsigned long results[2];

static void* worker(void* arg) {
  const long k = (long)arg;
  unsigned long s = 0;
  for (long i = 0; i < iterations; i++) s = s * 6364136223846793005UL + (unsigned long)(i ^ k);
  results[k] = s;
  atomic_fetch_add(&done, 1);
  return NULL;
}

int main(int argc, char** argv) {
  if (argc > 1) iterations = atol(argv[1]);
  pthread_t t[2];
  for (long i = 0; i < 2; i++) pthread_create(&t[i], NULL, worker, (void*)i);
  const struct timespec tick = {0, 5 * 1000 * 1000};
  while (atomic_load(&done) < 2) nanosleep(&tick, NULL);
  printf("%lu %lu\n", results[0], results[1]);
  for (int i = 0; i < 2; i++) pthread_detach(t[i]);
  return 0;
}
