/*
 * ffi/tests/cell_token.rs: one-slot permits of a shared handle are cell
 * tokens (serial bit 63), released once, checked by the slot's own
 * give-back CAS. Prints "FAIL ..." lines for what went wrong and "done"
 * at the end; exits 0 only if nothing failed.
 *
 *   - a double release: ALREADY_RELEASED, and the slot is not freed again
 *     for the next holder;
 *   - garbage tokens (random serials with bit 63 set, this process's tag):
 *     ALREADY_RELEASED, never a crash, never a free;
 *   - a weighted permit and a child's permit are table tokens (bit 63 clear);
 *   - a permit released after its handle was closed frees its slot;
 *   - max 1 and max 65536: the slot numbered 65535 round-trips;
 *   - a forked child cannot release its parent's token (FOREIGN_PERMIT) and
 *     the parent's slot stays held; the parent releases it afterwards;
 *   - the lean path (acquire, try_acquire: the cell's own next tag) and the
 *     general one (acquire_timeout: the thread's tag) give tokens of the
 *     same slot and cell, each released once, a stale one of either kind
 *     never freeing the other's slot; what the lean path declines (NULL
 *     arguments, a bad priority, a disposed handle, an inherited handle in
 *     a forked child) answers with the general path's status and message;
 *   - a permit released on another thread (whose first release goes the
 *     general way, registering its hazard record) is released once;
 *   - pin targets: handles of one region binding share one pin slot; a
 *     token of a closed handle is released (OK, slot freed) while another
 *     handle is open and after the last one closed; two regions never
 *     share a slot; releases racing the last close and new handles free
 *     each token once; detach of the last handle leaves the process table,
 *     with a permit out or another handle open it is refused as before.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shmsched.h"

static int failures;

#define CHECK(cond, ...)                  \
  do {                                    \
    if (!(cond)) {                        \
      printf("FAIL line %d: ", __LINE__); \
      printf(__VA_ARGS__);                \
      printf("\n");                       \
      failures++;                         \
    }                                     \
  } while (0)

static void must(shmsched_status st, const char *what) {
  if (st != SHMSCHED_STATUS_OK) {
    char msg[512];
    shmsched_last_error_message(msg, sizeof msg);
    printf("FAIL %s: %s (%s)\n", what, shmsched_strerror(st), msg);
    fflush(stdout);
    exit(1);
  }
}

static uint32_t running(shmsched_scheduler *s) {
  uint32_t n = 0;
  must(shmsched_scheduler_global_running(s, &n), "global_running");
  return n;
}

static shmsched_scheduler *shared(shmsched_region **r, uint32_t max) {
  shmsched_scheduler *s;
  must(shmsched_region_anonymous(0, r), "region_anonymous");
  must(shmsched_scheduler_shared(*r, max, &s), "scheduler_shared");
  return s;
}

static const uint64_t CELL_TOKEN = (uint64_t)1 << 63;

/* This thread's last error message. */
static const char *message(void) {
  static char msg[512];
  shmsched_last_error_message(msg, sizeof msg);
  return msg;
}

/* Releases a token on a thread of its own: the first release, then a
 * second one, which must find it released. */
static void *release_twice(void *arg) {
  shmsched_permit *p = arg;
  static shmsched_status st[2];
  st[0] = shmsched_permit_release(*p);
  st[1] = shmsched_permit_release(*p);
  return st;
}

/* Lean and general paths: see the header comment. */
static void lean_and_general(void) {
  shmsched_region *r;
  shmsched_scheduler *s = shared(&r, 1);
  shmsched_permit l, g, t;
  must(shmsched_scheduler_acquire(s, SHMSCHED_PRIORITY_NORMAL, &l), "lean acquire");
  CHECK(shmsched_permit_release(l) == SHMSCHED_STATUS_OK, "release l");
  must(shmsched_scheduler_acquire_timeout(s, SHMSCHED_PRIORITY_NORMAL, 1000000000ull, &g),
       "general acquire");
  CHECK((g.serial & CELL_TOKEN) && g.serial >> 32 == l.serial >> 32,
        "same slot and cell: %#llx %#llx", (unsigned long long)l.serial,
        (unsigned long long)g.serial);
  CHECK((uint32_t)g.serial != (uint32_t)l.serial, "another tag");
  CHECK(shmsched_permit_release(l) == SHMSCHED_STATUS_ALREADY_RELEASED, "stale lean token");
  CHECK(running(s) == 1, "the general token's slot is held: running %u", running(s));
  CHECK(shmsched_permit_release(g) == SHMSCHED_STATUS_OK, "release g");
  CHECK(shmsched_permit_release(g) == SHMSCHED_STATUS_ALREADY_RELEASED, "release g again");
  must(shmsched_scheduler_try_acquire(s, SHMSCHED_PRIORITY_HIGH, &t), "lean try_acquire");
  CHECK(t.serial >> 32 == l.serial >> 32, "the same slot again");
  CHECK(shmsched_permit_release(g) == SHMSCHED_STATUS_ALREADY_RELEASED, "stale general token");
  CHECK(shmsched_permit_release(l) == SHMSCHED_STATUS_ALREADY_RELEASED, "stale lean token");
  CHECK(running(s) == 1, "t's slot is held: running %u", running(s));
  CHECK(shmsched_scheduler_try_acquire(s, SHMSCHED_PRIORITY_NORMAL, &l) ==
            SHMSCHED_STATUS_WOULD_BLOCK,
        "full: %s", message());

  /* Released on another thread, once. */
  pthread_t th;
  void *res = NULL;
  CHECK(pthread_create(&th, NULL, release_twice, &t) == 0, "pthread_create");
  CHECK(pthread_join(th, &res) == 0, "pthread_join");
  if (res) {
    shmsched_status *st = res;
    CHECK(st[0] == SHMSCHED_STATUS_OK, "released on another thread: %d", (int)st[0]);
    CHECK(st[1] == SHMSCHED_STATUS_ALREADY_RELEASED, "and only once: %d", (int)st[1]);
  }
  CHECK(running(s) == 0, "freed: running %u", running(s));

  /* What the lean path declines. */
  CHECK(shmsched_scheduler_acquire(NULL, SHMSCHED_PRIORITY_NORMAL, &l) ==
            SHMSCHED_STATUS_NULL_ARGUMENT,
        "NULL sched");
  CHECK(strcmp(message(), "argument `sched` is NULL") == 0, "message: %s", message());
  CHECK(shmsched_scheduler_acquire(s, SHMSCHED_PRIORITY_NORMAL, NULL) ==
            SHMSCHED_STATUS_NULL_ARGUMENT,
        "NULL out");
  CHECK(strcmp(message(), "argument `out` is NULL") == 0, "message: %s", message());
  CHECK(shmsched_scheduler_try_acquire(s, 4, &l) == SHMSCHED_STATUS_INVALID_PRIORITY,
        "priority 4");
  CHECK(strstr(message(), "4") != NULL, "message: %s", message());

  /* An inherited handle in a forked child: FORKED, nothing taken; a new
   * handle there takes the lean path. */
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    int code = 0;
    if (shmsched_scheduler_acquire(s, SHMSCHED_PRIORITY_NORMAL, &l) != SHMSCHED_STATUS_FORKED ||
        strstr(message(), "fork") == NULL)
      code = 7;
    if (shmsched_scheduler_try_acquire(s, SHMSCHED_PRIORITY_NORMAL, &l) != SHMSCHED_STATUS_FORKED)
      code = 8;
    shmsched_scheduler *mine;
    if (shmsched_scheduler_attach(r, &mine) != SHMSCHED_STATUS_OK) _exit(9);
    if (shmsched_scheduler_acquire(mine, SHMSCHED_PRIORITY_NORMAL, &l) != SHMSCHED_STATUS_OK ||
        !(l.serial & CELL_TOKEN))
      code = 10;
    if (shmsched_permit_release(l) != SHMSCHED_STATUS_OK ||
        shmsched_permit_release(l) != SHMSCHED_STATUS_ALREADY_RELEASED)
      code = 11;
    _exit(code);
  }
  int wst = 0;
  waitpid(pid, &wst, 0);
  CHECK(WIFEXITED(wst) && WEXITSTATUS(wst) == 0, "the forked child's checks (status %d)", wst);
  CHECK(running(s) == 0, "nothing taken in the child: running %u", running(s));

  must(shmsched_scheduler_dispose(s), "dispose");
  CHECK(shmsched_scheduler_acquire(s, SHMSCHED_PRIORITY_NORMAL, &l) == SHMSCHED_STATUS_DISPOSED,
        "disposed");
  CHECK(shmsched_scheduler_try_acquire(s, SHMSCHED_PRIORITY_NORMAL, &l) ==
            SHMSCHED_STATUS_DISPOSED,
        "disposed (try)");
  CHECK(running(s) == 0, "nothing taken: running %u", running(s));
  shmsched_scheduler_close(s);
  shmsched_region_close(r);
}

/* The pin slot a cell token names. */
static unsigned pin_slot(shmsched_permit p) { return (unsigned)(p.serial >> 49) & 0x3fff; }

/* Region-wide live process entries, seen through `s`. */
static uint32_t processes(shmsched_scheduler *s) {
  shmsched_scheduler_stats st;
  memset(&st, 0, sizeof st);
  st.size = sizeof st;
  must(shmsched_scheduler_get_stats(s, &st), "get_stats");
  return st.region.processes;
}

struct race {
  pthread_barrier_t *go;
  const shmsched_permit *toks;
  int backwards;
  int *wins; /* one counter per token, shared */
  pthread_mutex_t *m;
  int bad;
};

/* Releases every token of a round (in one order or the other), counting
 * the ones it won. */
static void *race_release(void *arg) {
  struct race *r = arg;
  pthread_barrier_wait(r->go);
  for (int k = 0; k < 4; k++) {
    int i = r->backwards ? 3 - k : k;
    shmsched_status st = shmsched_permit_release(r->toks[i]);
    if (st == SHMSCHED_STATUS_OK) {
      pthread_mutex_lock(r->m);
      r->wins[i]++;
      pthread_mutex_unlock(r->m);
    } else if (st != SHMSCHED_STATUS_ALREADY_RELEASED) {
      r->bad++;
    }
  }
  return NULL;
}

/* Pin targets: see the header comment. `seer` counts through a binding of
 * its own (the region opened again from its fd), so it never shares a
 * target with the handles under test. */
static void pin_targets(void) {
  shmsched_region *r, *again, *r2;
  shmsched_scheduler *s1 = shared(&r, 8), *s2, *seer, *other;
  int fd = -1;
  must(shmsched_region_dup_fd(r, &fd), "dup_fd");
  must(shmsched_region_open_fd(fd, &again), "open_fd");
  close(fd);
  must(shmsched_scheduler_attach(again, &seer), "attach seer");
  must(shmsched_scheduler_attach(r, &s2), "attach s2");
  shmsched_permit a, b, c;
  must(shmsched_scheduler_acquire(s1, SHMSCHED_PRIORITY_NORMAL, &a), "acquire a");
  must(shmsched_scheduler_acquire_timeout(s2, SHMSCHED_PRIORITY_NORMAL, 1000000000ull, &b),
       "acquire b");
  must(shmsched_scheduler_acquire(seer, SHMSCHED_PRIORITY_NORMAL, &c), "acquire c");
  CHECK(pin_slot(a) == pin_slot(b), "one binding, one slot: %u %u", pin_slot(a), pin_slot(b));
  CHECK(pin_slot(a) != pin_slot(c), "another binding, another slot: %u", pin_slot(c));
  CHECK(shmsched_permit_release(c) == SHMSCHED_STATUS_OK, "release c");

  /* A token of a closed handle, another handle open. */
  shmsched_scheduler_close(s1);
  CHECK(running(seer) == 2, "held across the close: running %u", running(seer));
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_OK, "a after its handle closed");
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_ALREADY_RELEASED, "a again");
  /* After the last handle closed. */
  shmsched_scheduler_close(s2);
  CHECK(running(seer) == 1, "b held: running %u", running(seer));
  CHECK(shmsched_permit_release(b) == SHMSCHED_STATUS_OK, "b after the last close");
  CHECK(shmsched_permit_release(b) == SHMSCHED_STATUS_ALREADY_RELEASED, "b again");
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_ALREADY_RELEASED, "a once more");
  CHECK(running(seer) == 0, "all free: running %u", running(seer));

  /* Two regions: two slots. */
  must(shmsched_region_anonymous(0, &r2), "region_anonymous");
  must(shmsched_scheduler_shared(r2, 2, &other), "shared r2");
  must(shmsched_scheduler_attach(r, &s1), "attach s1");
  must(shmsched_scheduler_acquire(s1, SHMSCHED_PRIORITY_NORMAL, &a), "acquire a (r)");
  must(shmsched_scheduler_acquire(other, SHMSCHED_PRIORITY_NORMAL, &b), "acquire b (r2)");
  CHECK(pin_slot(a) != pin_slot(b), "two regions, two slots: %u", pin_slot(a));
  shmsched_scheduler_close(other);
  CHECK(shmsched_permit_release(b) == SHMSCHED_STATUS_OK, "release b (r2)");
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_OK, "release a (r)");
  shmsched_region_close(r2);

  /* Releases racing the last close and a new handle. */
  pthread_barrier_t go;
  pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
  pthread_barrier_init(&go, NULL, 3);
  for (int round = 0; round < 500; round++) {
    shmsched_permit toks[4];
    int wins[4] = {0, 0, 0, 0};
    for (int i = 0; i < 4; i++) {
      must(shmsched_scheduler_acquire(s1, SHMSCHED_PRIORITY_NORMAL, &toks[i]), "acquire");
    }
    struct race rs[2] = {{&go, toks, 0, wins, &m, 0}, {&go, toks, 1, wins, &m, 0}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, race_release, &rs[i]);
    pthread_barrier_wait(&go);
    shmsched_scheduler_close(s1); /* the binding's last handle */
    must(shmsched_scheduler_attach(r, &s1), "attach again");
    must(shmsched_scheduler_try_acquire(s1, SHMSCHED_PRIORITY_NORMAL, &a), "try_acquire");
    CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_OK, "round %d: release", round);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
      CHECK(wins[i] == 1, "round %d: token %d released %d times", round, i, wins[i]);
    }
    CHECK(rs[0].bad + rs[1].bad == 0, "round %d: another status", round);
    CHECK(running(seer) == 0, "round %d: running %u", round, running(seer));
    if (failures) break;
  }
  pthread_barrier_destroy(&go);

  /* Detach. The last handle, nothing out: OK, the process entry leaves. */
  uint32_t before = processes(seer);
  CHECK(shmsched_scheduler_detach(s1) == SHMSCHED_STATUS_OK, "detach the last handle: %s",
        message());
  CHECK(processes(seer) == before - 1, "left the table: %u -> %u", before, processes(seer));
  /* With a permit out: refused, the permit released after. */
  must(shmsched_scheduler_attach(r, &s1), "attach s1");
  must(shmsched_scheduler_acquire(s1, SHMSCHED_PRIORITY_NORMAL, &a), "acquire a");
  CHECK(shmsched_scheduler_detach(s1) == SHMSCHED_STATUS_INVALID_ARGUMENT,
        "detach with a permit out");
  CHECK(strstr(message(), "holds 1 permit") != NULL, "message: %s", message());
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_OK, "released after the refusal");
  CHECK(running(seer) == 0, "freed: running %u", running(seer));
  /* With another handle open on the binding: refused, the other works and
   * then detaches. */
  before = processes(seer);
  must(shmsched_scheduler_attach(r, &s1), "attach s1");
  must(shmsched_scheduler_attach(r, &s2), "attach s2");
  CHECK(processes(seer) == before + 1, "one binding: %u", processes(seer));
  CHECK(shmsched_scheduler_detach(s1) == SHMSCHED_STATUS_INVALID_ARGUMENT,
        "detach beside another handle");
  CHECK(strstr(message(), "shares the region") != NULL, "message: %s", message());
  must(shmsched_scheduler_acquire(s2, SHMSCHED_PRIORITY_NORMAL, &b), "acquire through s2");
  CHECK(shmsched_permit_release(b) == SHMSCHED_STATUS_OK, "release b");
  CHECK(shmsched_scheduler_detach(s2) == SHMSCHED_STATUS_OK, "detach s2: %s", message());
  CHECK(processes(seer) == before, "left the table: %u", processes(seer));

  shmsched_scheduler_close(seer);
  shmsched_region_close(again);
  shmsched_region_close(r);
}

int main(void) {
  shmsched_region *r;
  shmsched_scheduler *s = shared(&r, 2);
  shmsched_permit a, b;

  /* Double release. */
  must(shmsched_scheduler_acquire(s, SHMSCHED_PRIORITY_NORMAL, &a), "acquire");
  CHECK(a.serial & CELL_TOKEN, "a one-slot permit is a cell token: %#llx",
        (unsigned long long)a.serial);
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_OK, "first release");
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_ALREADY_RELEASED, "second release");
  must(shmsched_scheduler_acquire(s, SHMSCHED_PRIORITY_NORMAL, &b), "acquire b");
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_ALREADY_RELEASED, "stale release");
  CHECK(running(s) == 1, "b still held: running %u", running(s));

  /* Garbage. */
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 100000; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    shmsched_permit g = {b.process, x | CELL_TOKEN};
    if (g.serial == b.serial) continue;
    shmsched_status st = shmsched_permit_release(g);
    if (st != SHMSCHED_STATUS_ALREADY_RELEASED) {
      CHECK(0, "garbage serial %#llx: %s", (unsigned long long)g.serial, shmsched_strerror(st));
      break;
    }
  }
  CHECK(running(s) == 1, "garbage freed nothing: running %u", running(s));
  CHECK(shmsched_permit_release(b) == SHMSCHED_STATUS_OK, "release b");

  /* Weighted and child permits are table tokens. */
  shmsched_permit m, c;
  must(shmsched_scheduler_acquire_many(s, SHMSCHED_PRIORITY_NORMAL, 2, &m), "acquire_many");
  CHECK(!(m.serial & CELL_TOKEN), "a weighted permit is a table token");
  CHECK(shmsched_permit_release(m) == SHMSCHED_STATUS_OK, "release m");
  shmsched_scheduler *child;
  must(shmsched_scheduler_child(s, 1, &child), "child");
  must(shmsched_scheduler_acquire(child, SHMSCHED_PRIORITY_NORMAL, &c), "acquire child");
  CHECK(!(c.serial & CELL_TOKEN), "a child's permit is a table token");
  CHECK(shmsched_permit_release(c) == SHMSCHED_STATUS_OK, "release c");
  CHECK(shmsched_permit_release(c) == SHMSCHED_STATUS_ALREADY_RELEASED, "release c again");
  shmsched_scheduler_close(child);

  /* Released after close: frees its slot (counted through a second handle). */
  shmsched_scheduler *other;
  must(shmsched_scheduler_attach(r, &other), "attach");
  must(shmsched_scheduler_acquire(s, SHMSCHED_PRIORITY_NORMAL, &a), "acquire a");
  shmsched_scheduler_close(s);
  CHECK(running(other) == 1, "held across the close");
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_OK, "release after close");
  CHECK(running(other) == 0, "freed after close: running %u", running(other));
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_ALREADY_RELEASED, "again after close");

  /* Fork: the child cannot release the parent's token. */
  must(shmsched_scheduler_acquire(other, SHMSCHED_PRIORITY_NORMAL, &a), "acquire for fork");
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    int code = shmsched_permit_release(a) == SHMSCHED_STATUS_FOREIGN_PERMIT ? 0 : 7;
    _exit(code);
  }
  int wst = 0;
  waitpid(pid, &wst, 0);
  CHECK(WIFEXITED(wst) && WEXITSTATUS(wst) == 0, "the child got FOREIGN_PERMIT (status %d)", wst);
  CHECK(running(other) == 1, "the parent's slot stays held: running %u", running(other));
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_OK, "the parent releases it");
  shmsched_scheduler_close(other);
  shmsched_region_close(r);

  lean_and_general();
  pin_targets();

  /* Max 1 and max 65536. */
  s = shared(&r, 1);
  must(shmsched_scheduler_acquire(s, SHMSCHED_PRIORITY_NORMAL, &a), "acquire max 1");
  CHECK(((a.serial >> 32) & 0xffff) == 0, "max 1: slot 0");
  CHECK(shmsched_permit_release(a) == SHMSCHED_STATUS_OK, "release max 1");
  shmsched_scheduler_close(s);
  shmsched_region_close(r);
  s = shared(&r, 65536);
  shmsched_permit *all = malloc(65536 * sizeof *all);
  int found = -1;
  for (int i = 0; i < 65536; i++) {
    must(shmsched_scheduler_try_acquire(s, SHMSCHED_PRIORITY_NORMAL, &all[i]), "try_acquire");
    if (((all[i].serial >> 32) & 0xffff) == 65535) found = i;
  }
  CHECK(found >= 0, "slot 65535 named by a token");
  CHECK(shmsched_scheduler_try_acquire(s, SHMSCHED_PRIORITY_NORMAL, &a) ==
            SHMSCHED_STATUS_WOULD_BLOCK,
        "full");
  for (int i = 0; i < 65536; i++) {
    CHECK(shmsched_permit_release(all[i]) == SHMSCHED_STATUS_OK, "release %d", i);
  }
  if (found >= 0) {
    CHECK(shmsched_permit_release(all[found]) == SHMSCHED_STATUS_ALREADY_RELEASED, "65535 again");
  }
  CHECK(running(s) == 0, "all free: running %u", running(s));
  free(all);
  shmsched_scheduler_close(s);
  shmsched_region_close(r);

  printf("done\n");
  return failures ? 1 : 0;
}
