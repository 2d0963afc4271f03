/* Reads its standard input as benchmark programs run as `PROG < input` do: the main thread
 * reads the first line, starts two workers and joins them (the migration point), then reads
 * the rest; prints the number of lines and bytes and a checksum. With --worker_reads, each
 * worker reads a block of standard input itself after computing (prints the bytes they got).
 * Usage: read_stdin [--worker_reads]. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile unsigned long spin;
static int worker_reads;
static long worker_got[2];

static void* worker(void* arg) {
  for (long i = 0; i < 300000000L; i++) spin += (unsigned long)i;
  if (worker_reads) {
    char block[64];
    worker_got[(long)arg] = read(0, block, sizeof(block));
  }
  return NULL;
}

int main(int argc, char** argv) {
  worker_reads = argc > 1 && strcmp(argv[1], "--worker_reads") == 0;
  char line[4096];
  long lines = 0, bytes = 0;
  unsigned long sum = 0;
  if (!worker_reads) {
    if (fgets(line, sizeof(line), stdin) == NULL) return 3;
    lines++;
    bytes += (long)strlen(line);
  }
  pthread_t t[2];
  for (long i = 0; i < 2; i++) pthread_create(&t[i], NULL, worker, (void*)i);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  if (worker_reads) {
    printf("workers read %ld bytes\n", worker_got[0] + worker_got[1]);
    return 0;
  }
  while (fgets(line, sizeof(line), stdin) != NULL) {
    lines++;
    bytes += (long)strlen(line);
    for (const char* c = line; *c; c++) sum = sum * 31 + (unsigned char)*c;
  }
  printf("%ld lines, %ld bytes, checksum %lu\n", lines, bytes, sum);
  return 0;
}
