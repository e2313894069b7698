/* The C interface (gradsync_c.h), compiled as C: every error path and the values synchronize
 * produces, against analytic per-rank values. Failures are agreed across ranks (no rank hangs). */
#define _POSIX_C_SOURCE 200112L /* setenv */
#include <gradsync/gradsync_c.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank_, size_, failures_;

#define CHECK(cond)                                                                                           \
  do {                                                                                                        \
    if (!(cond)) {                                                                                            \
      ++failures_;                                                                                            \
      fprintf(stderr, "rank %d: %s:%d: CHECK(%s) failed; last error: %s\n", rank_, __FILE__, __LINE__, #cond, \
              gradsync_last_error());                                                                         \
    }                                                                                                         \
  } while (0)

/* status s, and the message contains every given fragment */
static int error_is(int got, int want, const char* frag1, const char* frag2) {
  const char* msg = gradsync_last_error();
  int ok = got == want && (!frag1 || strstr(msg, frag1)) && (!frag2 || strstr(msg, frag2));
  if (!ok)
    fprintf(stderr, "rank %d: expected %s with '%s' '%s', got %s: %s\n", rank_, gradsync_status_name(want),
            frag1 ? frag1 : "", frag2 ? frag2 : "", gradsync_status_name(got), msg);
  return ok;
}

static gradsync_handle make(void) {
  gradsync_handle h = NULL;
  int s = gradsync_create(MPI_Comm_c2f(MPI_COMM_WORLD), NULL, &h);
  if (s != GRADSYNC_OK || !h) {
    fprintf(stderr, "rank %d: gradsync_create failed: %s\n", rank_, gradsync_last_error());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return h;
}

static void test_create_errors(void) {
  gradsync_handle h = (gradsync_handle)&h; /* must be overwritten with NULL on failure */
  gradsync_options o;
  CHECK(error_is(gradsync_options_init(NULL), GRADSYNC_ERR_INVALID_ARGUMENT, "gradsync_options_init", NULL));
  CHECK(gradsync_options_init(&o) == GRADSYNC_OK);
  CHECK(o.op == GRADSYNC_AVERAGE && o.backward_passes_per_step == 1 && o.prescale_factor == 1.0);
  CHECK(error_is(gradsync_create(MPI_Comm_c2f(MPI_COMM_WORLD), NULL, NULL), GRADSYNC_ERR_INVALID_ARGUMENT,
                 "out is NULL", NULL));
  CHECK(error_is(gradsync_create(MPI_Comm_c2f(MPI_COMM_NULL), NULL, &h), GRADSYNC_ERR_INVALID_ARGUMENT, "MPI_COMM_NULL",
                 NULL));
  CHECK(h == NULL);
  o.op = 7;
  CHECK(error_is(gradsync_create(MPI_Comm_c2f(MPI_COMM_WORLD), &o, &h), GRADSYNC_ERR_INVALID_ARGUMENT, "op 7", NULL));
  gradsync_options_init(&o);
  o.backward_passes_per_step = 0;
  CHECK(error_is(gradsync_create(MPI_Comm_c2f(MPI_COMM_WORLD), &o, &h), GRADSYNC_ERR_INVALID_ARGUMENT,
                 "backward_passes_per_step is 0", NULL));
  CHECK(h == NULL);
}

static void test_bad_handles(void) {
  double x[2] = {1, 2};
  int32_t i32 = 0;
  gradsync_stats st;
  int dummy = 0;
  gradsync_handle fake = (gradsync_handle)&dummy, stale, null = NULL;
  /* NULL, a pointer that was never a handle, and a destroyed one: every entry point refuses them */
  stale = make();
  CHECK(gradsync_destroy(&stale) == GRADSYNC_OK && stale == NULL);
  stale = make();
  {
    gradsync_handle copy = stale;
    CHECK(gradsync_destroy(&copy) == GRADSYNC_OK);
  }
  gradsync_handle bad[3] = {NULL, fake, stale};
  for (int k = 0; k < 3; ++k) {
    gradsync_handle b = bad[k];
    const char* what = k == 0 ? "handle is NULL" : "not a live gradsync handle";
    CHECK(error_is(gradsync_add(b, x, 2, GRADSYNC_DOUBLE, GRADSYNC_DATA_PARALLEL, "x"), GRADSYNC_ERR_INVALID_HANDLE,
                   "gradsync_add", what));
    i32 = 7;
    CHECK(error_is(gradsync_synchronize(b, &i32), GRADSYNC_ERR_INVALID_HANDLE, "gradsync_synchronize", what));
    CHECK(i32 == 0);
    CHECK(error_is(gradsync_get_stats(b, &st), GRADSYNC_ERR_INVALID_HANDLE, "gradsync_get_stats", what));
    CHECK(error_is(gradsync_size(b, &i32), GRADSYNC_ERR_INVALID_HANDLE, "gradsync_size", what));
    CHECK(error_is(gradsync_rank(b, &i32), GRADSYNC_ERR_INVALID_HANDLE, "gradsync_rank", what));
    CHECK(error_is(gradsync_destroy(&b), GRADSYNC_ERR_INVALID_HANDLE, "gradsync_destroy", what));
  }
  (void)null;
  CHECK(error_is(gradsync_destroy(NULL), GRADSYNC_ERR_INVALID_ARGUMENT, "gradsync_destroy", "pointer is NULL"));
}

static void test_add_errors(void) {
  double x[4] = {0}, y[4] = {0};
  gradsync_handle h = make();
  CHECK(error_is(gradsync_add(h, x, 4, 3, GRADSYNC_DATA_PARALLEL, "w"), GRADSYNC_ERR_INVALID_ARGUMENT, "buffer 'w'",
                 "dtype 3"));
  CHECK(
      error_is(gradsync_add(h, x, 4, GRADSYNC_DOUBLE, 9, "w"), GRADSYNC_ERR_INVALID_ARGUMENT, "buffer 'w'", "kind 9"));
  CHECK(error_is(gradsync_add(h, x, -1, GRADSYNC_DOUBLE, GRADSYNC_LOCAL, NULL), GRADSYNC_ERR_INVALID_ARGUMENT,
                 "unnamed", "negative"));
  CHECK(error_is(gradsync_add(h, NULL, 4, GRADSYNC_FLOAT, GRADSYNC_LOCAL, "p"), GRADSYNC_ERR_INVALID_ARGUMENT,
                 "buffer 'p'", "data is NULL"));
  CHECK(gradsync_add(h, x, 4, GRADSYNC_DOUBLE, GRADSYNC_DATA_PARALLEL, "w") == GRADSYNC_OK);
  /* the same memory twice, or overlapping: a gradsync error naming both */
  CHECK(error_is(gradsync_add(h, x + 2, 2, GRADSYNC_DOUBLE, GRADSYNC_LOCAL, "w_tail"), GRADSYNC_ERR_RUNTIME, "'w_tail'",
                 "'w'"));
  CHECK(gradsync_add(h, y, 4, GRADSYNC_DOUBLE, GRADSYNC_LOCAL, "y") == GRADSYNC_OK);
  CHECK(gradsync_add(h, NULL, 0, GRADSYNC_FLOAT, GRADSYNC_LOCAL, "empty") == GRADSYNC_OK);
  CHECK(error_is(gradsync_get_stats(h, NULL), GRADSYNC_ERR_INVALID_ARGUMENT, "out is NULL", NULL));
  CHECK(error_is(gradsync_size(h, NULL), GRADSYNC_ERR_INVALID_ARGUMENT, "size is NULL", NULL));
  CHECK(error_is(gradsync_rank(h, NULL), GRADSYNC_ERR_INVALID_ARGUMENT, "rank is NULL", NULL));
  /* the handle still works after the refused calls */
  int32_t done = 0;
  CHECK(gradsync_synchronize(h, &done) == GRADSYNC_OK && done == 1);
  CHECK(gradsync_destroy(&h) == GRADSYNC_OK);
}

/* Values: g on rank r is (r+1)*(k+1) for element k; analytic results for every kind and type. */
static void test_values(void) {
  enum { N = 5 };
  double dp[N], ls[N], lu[N];
  float fdp[N], fls[N];
  int32_t n = 0, r = -1, done = 0;
  gradsync_stats st;
  gradsync_handle h = make();
  CHECK(gradsync_size(h, &n) == GRADSYNC_OK && n == size_);
  CHECK(gradsync_rank(h, &r) == GRADSYNC_OK && r == rank_);
  CHECK(gradsync_add(h, dp, N, GRADSYNC_DOUBLE, GRADSYNC_DATA_PARALLEL, "dp") == GRADSYNC_OK);
  CHECK(gradsync_add(h, fdp, N, GRADSYNC_FLOAT, GRADSYNC_DATA_PARALLEL, "fdp") == GRADSYNC_OK);
  CHECK(gradsync_add(h, ls, N, GRADSYNC_DOUBLE, GRADSYNC_LOCAL_SCALED, "ls") == GRADSYNC_OK);
  CHECK(gradsync_add(h, lu, N, GRADSYNC_DOUBLE, GRADSYNC_LOCAL, "lu") == GRADSYNC_OK);
  /* a local float buffer on rank 0 only: local registrations may differ across ranks */
  if (rank_ == 0) CHECK(gradsync_add(h, fls, N, GRADSYNC_FLOAT, GRADSYNC_LOCAL_SCALED, "fls") == GRADSYNC_OK);
  for (int step = 0; step < 2; ++step) {
    for (int k = 0; k < N; ++k) dp[k] = ls[k] = lu[k] = fdp[k] = fls[k] = (float)((rank_ + 1) * (k + 1));
    CHECK(gradsync_synchronize(h, &done) == GRADSYNC_OK && done == 1);
    const double mean_r = (size_ + 1) / 2.0; /* mean of r+1 over ranks */
    for (int k = 0; k < N; ++k) {
      const double mine = (rank_ + 1) * (k + 1);
      CHECK(fabs(dp[k] - mean_r * (k + 1)) < 1e-12);
      CHECK(fabs(fdp[k] - mean_r * (k + 1)) < 1e-5);
      CHECK(fabs(ls[k] - mine / size_) < 1e-12);
      CHECK(lu[k] == mine);
      if (rank_ == 0) CHECK(fabs(fls[k] - mine / size_) < 1e-6);
    }
  }
  CHECK(gradsync_get_stats(h, &st) == GRADSYNC_OK);
  CHECK(st.passes == 2 && st.steps == 2);
  /* data-parallel bytes only (one rank may skip the wire) */
  if (size_ > 1) CHECK(st.bytes_allreduced == 2u * N * (sizeof(double) + sizeof(float)));
  CHECK(gradsync_destroy(&h) == GRADSYNC_OK);
}

/* Options: sum, two backward passes averaged, pre- and postscale. */
static void test_options(void) {
  double g[3], l[3];
  int32_t done = 7;
  gradsync_options o;
  gradsync_handle h = NULL;
  gradsync_options_init(&o);
  o.op = GRADSYNC_SUM;
  o.backward_passes_per_step = 2;
  o.average_aggregated_gradients = 1;
  o.prescale_factor = 0.5;
  o.postscale_factor = 3.0;
  CHECK(gradsync_create(MPI_Comm_c2f(MPI_COMM_WORLD), &o, &h) == GRADSYNC_OK);
  CHECK(gradsync_add(h, g, 3, GRADSYNC_DOUBLE, GRADSYNC_DATA_PARALLEL, "g") == GRADSYNC_OK);
  CHECK(gradsync_add(h, l, 3, GRADSYNC_DOUBLE, GRADSYNC_LOCAL, "l") == GRADSYNC_OK);
  for (int pass = 0; pass < 2; ++pass) {
    for (int k = 0; k < 3; ++k) g[k] = l[k] = (rank_ + 1) * (k + 1) * (pass + 1);
    CHECK(gradsync_synchronize(h, &done) == GRADSYNC_OK);
    CHECK(done == (pass == 1));
  }
  /* sum over ranks of (r+1)(k+1)(1+2), times 0.5 * 3, divided by 2 passes */
  const double sum_r = size_ * (size_ + 1) / 2.0;
  for (int k = 0; k < 3; ++k) {
    CHECK(fabs(g[k] - sum_r * (k + 1) * 3 * 1.5 / 2) < 1e-12);
    CHECK(fabs(l[k] - (rank_ + 1) * (k + 1) * 3 / 2.0) < 1e-12);
  }
  CHECK(gradsync_destroy(&h) == GRADSYNC_OK);
}

/* Ranks that disagree get GRADSYNC_ERR_MISMATCH on every rank, naming the buffer; nothing hangs. */
static void test_mismatch(void) {
  double a[8] = {0}, b[8] = {0};
  float f[8] = {0};
  int32_t done = 7;
  gradsync_handle h;
  if (size_ < 2) return;
  /* a size */
  h = make();
  CHECK(gradsync_add(h, a, rank_ == size_ - 1 ? 7 : 8, GRADSYNC_DOUBLE, GRADSYNC_DATA_PARALLEL, "layer.w") ==
        GRADSYNC_OK);
  CHECK(error_is(gradsync_synchronize(h, &done), GRADSYNC_ERR_MISMATCH, "layer.w", NULL));
  CHECK(done == 0);
  CHECK(gradsync_destroy(&h) == GRADSYNC_OK);
  /* a kind: data-parallel on rank 0, local elsewhere */
  h = make();
  CHECK(gradsync_add(h, a, 8, GRADSYNC_DOUBLE, GRADSYNC_DATA_PARALLEL, "shared") == GRADSYNC_OK);
  CHECK(gradsync_add(h, b, 8, GRADSYNC_DOUBLE, rank_ == 0 ? GRADSYNC_DATA_PARALLEL : GRADSYNC_LOCAL, "head") ==
        GRADSYNC_OK);
  CHECK(error_is(gradsync_synchronize(h, &done), GRADSYNC_ERR_MISMATCH, NULL, NULL));
  CHECK(gradsync_destroy(&h) == GRADSYNC_OK);
  /* a value type: float on the last rank, double elsewhere */
  h = make();
  if (rank_ == size_ - 1)
    CHECK(gradsync_add(h, f, 8, GRADSYNC_FLOAT, GRADSYNC_DATA_PARALLEL, "typed") == GRADSYNC_OK);
  else
    CHECK(gradsync_add(h, a, 8, GRADSYNC_DOUBLE, GRADSYNC_DATA_PARALLEL, "typed") == GRADSYNC_OK);
  CHECK(error_is(gradsync_synchronize(h, &done), GRADSYNC_ERR_MISMATCH, NULL, NULL));
  CHECK(gradsync_destroy(&h) == GRADSYNC_OK);
}

/* A malformed GRADSYNC_* variable: GRADSYNC_ERR_CONFIG naming it; ignored with read_environment = 0. */
static void test_config_error(void) {
  gradsync_handle h = NULL;
  gradsync_options o;
  gradsync_options_init(&o);
  setenv("GRADSYNC_STALL_ACTION", "explode", 1);
  CHECK(error_is(gradsync_create(MPI_Comm_c2f(MPI_COMM_WORLD), NULL, &h), GRADSYNC_ERR_CONFIG, "GRADSYNC_STALL_ACTION",
                 "explode"));
  CHECK(h == NULL);
  o.read_environment = 0;
  CHECK(gradsync_create(MPI_Comm_c2f(MPI_COMM_WORLD), &o, &h) == GRADSYNC_OK);
  CHECK(gradsync_destroy(&h) == GRADSYNC_OK);
  unsetenv("GRADSYNC_STALL_ACTION");
}

static void test_status_names(void) {
  CHECK(strcmp(gradsync_status_name(GRADSYNC_OK), "GRADSYNC_OK") == 0);
  CHECK(strcmp(gradsync_status_name(GRADSYNC_ERR_MISMATCH), "GRADSYNC_ERR_MISMATCH") == 0);
  CHECK(strcmp(gradsync_status_name(99), "GRADSYNC_ERR_UNKNOWN_STATUS") == 0);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  /* The world size ctest launched it for (tests/launch_check.hpp says why). */
  const char* want = getenv("GSYNC_TEST_RANKS");
  if (want && *want && atoi(want) != size_) {
    fprintf(stderr, "test_c_api: launched for %s ranks (GSYNC_TEST_RANKS) but MPI_COMM_WORLD has %d\n", want, size_);
    MPI_Finalize();
    return 2;
  }
  test_create_errors();
  test_bad_handles();
  test_add_errors();
  test_values();
  test_options();
  test_mismatch();
  test_config_error();
  test_status_names();
  int any = failures_;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank_ == 0) printf("test_c_api: %d ranks, %s (%d failed checks)\n", size_, any ? "FAILED" : "passed", any);
  MPI_Finalize();
  return any ? 1 : 0;
}
