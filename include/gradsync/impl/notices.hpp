// gradsync internals: notices, the small messages ranks send each other outside the collectives.
//
// A rank waiting in a collective cannot learn from the collective why a peer is late or gone; the
// peers tell it with a notice (ARRIVED, FAILED, GONE: impl/stall.hpp says when each is sent). A notice
// is fixed-size and sent eagerly, so that sending one never waits for its receiver.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace gradsync::impl {

// A message on a side channel or the notice communicator (Control's notices), under this tag ("gs").
constexpr int kNoticeTag = 0x6773;
struct Notice {
  std::int64_t kind = 0, step = 0;
  std::uint64_t sync = 0;  // the sender's side channel (next_side_channel_id)
  char text[2024] = {};    // a relayed report nests its origin's: room for both (eager on every transport)
};

// Sends `n` to every rank of `comm` but `self` (or to `to` only). A send may complete after the sync
// that made it is gone, so the buffers belong to the process: they are kept here, reachable (leak
// checkers see no leak), until their sends completed; each new notice first frees those that did.
inline void send_notice(const Notice& n, MPI_Comm comm, int self, int size, int to) {
  struct Sent {
    std::unique_ptr<Notice> notice;
    std::vector<MPI_Request> requests;
  };
  static std::mutex m;
  static auto* outbox = new std::vector<Sent>();  // intentionally leaked: used until exit
  std::lock_guard<std::mutex> lock(m);
  for (std::size_t i = 0; i < outbox->size();) {
    int done = 0;
    auto& q = (*outbox)[i].requests;
    MPI_Testall(int(q.size()), q.data(), &done, MPI_STATUSES_IGNORE);
    if (done) {
      (*outbox)[i] = std::move(outbox->back());
      outbox->pop_back();
    } else {
      ++i;
    }
  }
  Sent sent{std::make_unique<Notice>(n), {}};
  for (int r = 0; r < size; ++r) {
    if (r == self || (to >= 0 && r != to)) continue;
    MPI_Request q = MPI_REQUEST_NULL;
    if (MPI_Isend(sent.notice.get(), int(sizeof(Notice)), MPI_BYTE, r, kNoticeTag, comm, &q) == MPI_SUCCESS)
      sent.requests.push_back(q);
  }
  outbox->push_back(std::move(sent));
}

}  // namespace gradsync::impl
