/* lbzip2's shape: the workers block the program's signals and, done, tell the main thread with
 * a signal to the whole process (kill(getpid(), ...)), which only main, waiting in sigsuspend,
 * does not block. Each worker computes, then sends one SIGRTMIN (queued: none is lost natively);
 * main counts them in its handler and prints the workers' results once it has them all, or
 * gives up after 60 s (SIGALRM) saying how many came. Usage: signal_main [WORKERS]
 * [ITERATIONS] (default 2 workers, 400 million iterations each). */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define MAX_WORKERS 16

static long iterations = 400000000L;
static unsigned long results[MAX_WORKERS];
static volatile sig_atomic_t received;

static void on_done(int sig) {
  (void)sig;
  received++;
}

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "timed out waiting for the workers' signals\n";
  (void)!write(2, msg, sizeof msg - 1);
  _exit(2);
}

static void* worker(void* arg) {
  const long k = (long)arg;
  unsigned long s = 0;
  for (long i = 0; i < iterations; i++) s = s * 6364136223846793005UL + (unsigned long)(i ^ k);
  results[k] = s;
  if (kill(getpid(), SIGRTMIN) != 0) perror("kill");
  return NULL;
}

int main(int argc, char** argv) {
  int workers = argc > 1 ? atoi(argv[1]) : 2;
  if (argc > 2) iterations = atol(argv[2]);
  if (workers < 1 || workers > MAX_WORKERS) {
    fprintf(stderr, "usage: signal_main [WORKERS (1-%d)] [ITERATIONS]\n", MAX_WORKERS);
    return 1;
  }
  struct sigaction sa = {0};
  sa.sa_handler = on_done;
  sigaction(SIGRTMIN, &sa, NULL);
  sa.sa_handler = on_alarm;
  sigaction(SIGALRM, &sa, NULL);
  sigset_t blocked, waiting;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGRTMIN);
  pthread_sigmask(SIG_BLOCK, &blocked, &waiting); /* the workers inherit it */
  pthread_t t[MAX_WORKERS];
  for (long i = 0; i < workers; i++) pthread_create(&t[i], NULL, worker, (void*)i);
  alarm(60);
  while (received < workers) sigsuspend(&waiting);
  alarm(0);
  for (int i = 0; i < workers; i++) pthread_join(t[i], NULL);
  for (int i = 0; i < workers; i++) printf("worker %d: %lu\n", i, results[i]);
  return 0;
}
