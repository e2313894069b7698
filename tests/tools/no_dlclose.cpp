// Preloaded into the sanitizer pass's ranks (GRADSYNC_SANITIZE): dlclose does nothing, so that Open
// MPI's MCA components stay mapped until the process ends and LeakSanitizer's report at exit can name
// the library of each of their allocations (tests/lsan.supp suppresses Open MPI's by library; an
// unloaded component shows as "<unknown module>", which no suppression can match). Built without
// the sanitizers: it is also loaded into mpirun.
extern "C" __attribute__((visibility("default"))) int dlclose(void*) { return 0; }
