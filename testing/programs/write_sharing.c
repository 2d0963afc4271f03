/* Two workers write for SECONDS (wall clock) while main joins them: in `shared` mode each to
 * its own cache line of ONE page, in `private` mode each to a page of its own. The buffer is
 * anonymous memory (mmap), and its address is printed first. Prints each worker's count at the
 * end. Usage: write_sharing shared|private SECONDS */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static volatile unsigned long* slot[2];
static double seconds;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

static void* worker(void* arg) {
  volatile unsigned long* s = slot[(long)arg];
  const double end = now() + seconds;
  for (;;) {
    for (int i = 0; i < 4096; i++) (*s)++;
    if (now() >= end) return NULL;
  }
}

int main(int argc, char** argv) {
  if (argc != 3 || (strcmp(argv[1], "shared") != 0 && strcmp(argv[1], "private") != 0)) {
    fprintf(stderr, "usage: write_sharing shared|private SECONDS\n");
    return 2;
  }
  seconds = atof(argv[2]);
  char* buf = mmap(NULL, 2 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (buf == MAP_FAILED) return 1;
  const int shared = strcmp(argv[1], "shared") == 0;
  slot[0] = (volatile unsigned long*)buf;
  slot[1] = (volatile unsigned long*)(buf + (shared ? 128 : 4096));
  *slot[0] = *slot[1] = 0; /* present before the watch, so it can be write-protected */
  printf("buffer %p\n", (void*)buf);
  fflush(stdout);
  pthread_t t[2];
  for (long i = 0; i < 2; i++) pthread_create(&t[i], NULL, worker, (void*)i);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  printf("done %d\n", *slot[0] > 0 && *slot[1] > 0);
  return 0;
}
