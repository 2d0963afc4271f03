/* Threads use a file that main opened before the migration point: one descriptor, one file
 * offset. Main reads the file's first 16 bytes, starts two workers and joins them; each worker
 * computes, then reads 64 bytes with read() (mode "read": the shared offset) or pread() at its
 * own offset (mode "pread"). Prints what they read. Usage: shared_fd FILE read|pread. */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static volatile unsigned long spin;
static int fd, positioned;
static long got[2];
static unsigned long sums[2];

static void* worker(void* arg) {
  const long k = (long)arg;
  for (long i = 0; i < 300000000L; i++) spin += (unsigned long)i;
  unsigned char buf[64];
  got[k] = positioned ? pread(fd, buf, sizeof(buf), 16 + k * 64) : read(fd, buf, sizeof(buf));
  for (long i = 0; i < got[k]; i++) sums[k] += buf[i];
  return NULL;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: shared_fd FILE read|pread\n");
    return 2;
  }
  positioned = strcmp(argv[2], "pread") == 0;
  fd = open(argv[1], O_RDONLY);
  char head[16];
  if (fd < 0 || read(fd, head, sizeof(head)) != sizeof(head)) {
    perror(argv[1]);
    return 1;
  }
  pthread_t t[2];
  for (long i = 0; i < 2; i++) pthread_create(&t[i], NULL, worker, (void*)i);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  printf("%ld bytes, sum %lu\n", got[0] + got[1], sums[0] + sums[1]);
  return 0;
}
