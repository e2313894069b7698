// The variable all-to-all the hybrid example moves embeddings with: MpiBackend over real ranks,
// SelfBackend as its 1-rank twin.
#include <gradsync/gradsync.hpp>
#include <vector>

#include "gradsync_test.hpp"

namespace {

// Rank r sends 1 + r + p values to rank p; value k of that block is r * 1000 + p * 10 + k.
template <class Backend, class T>
bool exchange_is_exact(const Backend& b) {
  const int n = b.size(), r = b.rank();
  const std::size_t un = static_cast<std::size_t>(n);
  std::vector<int> sc(un), sd(un), rc(un), rd(un);
  int st = 0, rt = 0;
  for (int p = 0; p < n; ++p) {
    sc[std::size_t(p)] = 1 + r + p;
    rc[std::size_t(p)] = 1 + p + r;
    sd[std::size_t(p)] = st;
    rd[std::size_t(p)] = rt;
    st += sc[std::size_t(p)];
    rt += rc[std::size_t(p)];
  }
  std::vector<T> send(static_cast<std::size_t>(st)), recv(static_cast<std::size_t>(rt), T(-1));
  for (int p = 0; p < n; ++p)
    for (int k = 0; k < sc[std::size_t(p)]; ++k) send[std::size_t(sd[std::size_t(p)] + k)] = T(r * 1000 + p * 10 + k);
  b.alltoallv(send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data());
  bool ok = true;
  for (int p = 0; p < n; ++p)
    for (int k = 0; k < rc[std::size_t(p)]; ++k)
      ok = ok && recv[std::size_t(rd[std::size_t(p)] + k)] == T(p * 1000 + r * 10 + k);
  return ok;
}

}  // namespace

TEST_CASE_TEMPLATE("alltoallv delivers every block to its rank, in order", T, double, int) {
  GRADSYNC_CHECK_ALL((exchange_is_exact<gradsync::MpiBackend, T>(gradsync::MpiBackend(MPI_COMM_WORLD))));
  GRADSYNC_CHECK_ALL((exchange_is_exact<gradsync::SelfBackend, T>(gradsync::SelfBackend{})));
}

TEST_CASE("SelfBackend::alltoallv rejects a send and receive count that differ") {
  const double send[2] = {1, 2};
  double recv[2] = {0, 0};
  const int two = 2, one = 1, zero = 0;
  CHECK_THROWS_AS(gradsync::SelfBackend{}.alltoallv(send, &two, &zero, recv, &one, &zero), gradsync::Error);
}
