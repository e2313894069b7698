// gradsync internals: a nonblocking in-place sum allreduce over point-to-point messages.
//
// Why: Open MPI 4.1's MPI_Iallreduce (libnbc) reduces to a root and broadcasts back whenever there
// are fewer than 4 ranks or the call is in place, so the bytes cross twice, one direction at a time,
// and the nonblocking path is far slower than the blocking MPI_Allreduce (docs/BENCHMARKS.md). This is the
// bandwidth-optimal ring instead: a reduce-scatter then an allgather, p - 1 steps each, every rank
// sending a 1/p segment to its right neighbour while receiving one from its left. The sum is the
// built-in MPI_SUM, applied with MPI_Reduce_local (for 16-bit wire values gradsync's own MPI_Op, which
// adds in fp32: receive 16-bit, add in fp32, send 16-bit). Each segment is summed once, by one rank, and
// then copied to the others, so every rank ends with the same bits. An optional factor (the 1/n of
// an average) multiplies each segment once, by its owner, in the pass of its last addition: no pass
// of its own over the bytes, where a scale after the allreduce would cost one.
//
// Compressed sums in place (impl/wire_ring.hpp) run the same schedule over the gradients' memory with
// 16-bit values on the wire: each send converts its segment, each receive adds into fp32 and rounds
// once, the owner rounds the whole sum and writes back post * it, and the allgather forwards those
// 16-bit values as received and writes each back the same way, so every rank ends with the same bits.
//
// A sum may run over several regions as if they were one buffer, their concatenation (the sync's
// grouped chunks: large tensors in place and a packed slot, one collective). A segment that spans
// regions goes as one message per piece; every rank passes regions of the same sizes, so the pieces
// (and the messages, matched in order on one tag) are the same on both ends.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "../error.hpp"
#include "vector_clones.hpp"
#include "wire_ring.hpp"

namespace gradsync::impl {

// The last addition of an average, (ours + received) * factor, in the CPU's widest vectors
// (impl/vector_clones.hpp).
template <class T>
GRADSYNC_IMPL_VECTOR_CLONES void sum_scale_loop(T* __restrict v, const T* __restrict w, std::size_t n, T f) {
  for (std::size_t i = 0; i < n; ++i) v[i] = (v[i] + w[i]) * f;
}
// The same with the values weighted (set_samples): (pre * ours + left * received) * factor, `left`
// the left neighbour's weight where it sent its own values (the first step), else 1.
template <class T>
GRADSYNC_IMPL_VECTOR_CLONES void weighted_sum_scale_loop(T* __restrict v, const T* __restrict w, std::size_t n, T f,
                                                         T pre, T left) {
  for (std::size_t i = 0; i < n; ++i) v[i] = (pre * v[i] + left * w[i]) * f;
}

inline void check_ring_call(int rc, const char* what) {
  if (rc != MPI_SUCCESS) throw Error(cat(what, " in the ring allreduce failed (code ", rc, ")"));
}

class RingAllreduce {
 public:
  /// Which part of the ring a sum runs: both halves (an allreduce), or one half of a sharded step.
  /// Halves number their segments so that rank r owns segment r (impl::shard_slice): the
  /// reduce-scatter leaves the sum there, the allgather sends it from there.
  enum class Half { both, reduce_scatter, allgather };

  /// A part of the buffer a sum runs over: `count` values at `data`.
  struct Region {
    unsigned char* data;
    std::size_t count;
  };

  /// Whether a state may be reused: false from start() until done, and forever for an operation
  /// abandoned unfinished (after a stall its messages may still arrive into its buffer).
  bool busy() const { return busy_; }

  /// Starts buf[0, count) = factor * sum over ranks of buf[0, count); `weighted` (every rank alike;
  /// float and double): of pre * buf, `pre` this rank's own. Each value meets its rank's weight
  /// once: in the addition that takes it, or for the segment a rank sends raw in the first step, in
  /// its right neighbour's addition, which has the weight from an 8-byte message sent ahead on the
  /// same tag (no pass over the values of its own). The reduce-scatter receives wait for a buffer
  /// from RingPool::lend; `order` ranks this sum among those waiting.
  template <class T>
  void start(T* buf, int count, double factor, MPI_Datatype type, MPI_Op op, MPI_Comm comm, int rank, int size, int tag,
             std::uint64_t order, bool weighted = false, double pre = 1.0) {
    one_region(buf, count);
    start_sum<T>(count, factor, type, op, comm, rank, size, tag, order, weighted, pre);
  }

  /// start() over `k` regions (gradsync::SumRegion<T>: `data`, `count`) summed as one buffer of their
  /// total length (every rank passes regions of the same sizes): regions[i] = factor * sum over
  /// ranks of regions[i].
  template <class T, class R>
  void start_regions(const R* regions, std::size_t k, double factor, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                     int rank, int size, int tag, std::uint64_t order, Half half = Half::both, bool weighted = false,
                     double pre = 1.0) {
    regions_.clear();
    std::size_t total = 0;
    for (std::size_t i = 0; i < k; ++i) {
      regions_.push_back(Region{reinterpret_cast<unsigned char*>(regions[i].data), regions[i].count});
      total += regions[i].count;
    }
    reqs_.assign(2 * std::max<std::size_t>(1, k), MPI_REQUEST_NULL);
    start_sum<T>(int(total), factor, type, op, comm, rank, size, tag, order, weighted, pre, half);
  }

 private:
  template <class T>
  void start_sum(int count, double factor, MPI_Datatype type, MPI_Op op, MPI_Comm comm, int rank, int size, int tag,
                 std::uint64_t order, bool weighted, double pre, Half half = Half::both) {
    busy_ = true;
    n_ = std::size_t(count);
    type_ = type;
    elem_ = sizeof(T);
    op_ = op;
    factor_ = factor;
    wire_ = nullptr;
    non_finite_ = -1;
    pre_ = weighted ? pre : 1.0;
    left_ = 1.0;
    weigh_ = nullptr;
    weighted =
        weighted && half != Half::allgather && size > 1 && (std::is_same_v<T, float> || std::is_same_v<T, double>);
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      sum_scale_ = factor == 1.0 && !weighted ? nullptr : &sum_scale<T>;
      if (weighted) weigh_ = &weighted_add<T>;
    } else {
      sum_scale_ = nullptr;  // 16-bit wire values (op adds them in fp32): never scaled here
    }
    begin_on(comm, rank, size, tag, order);
    if (half != Half::both) rot_ = size_ - 1;  // rank r ends the reduce-scatter owning ring segment r + 1
    if (half == Half::reduce_scatter) end_step_ = size_ - 1;
    if (half == Half::allgather) step_ = size_ - 1;
    if (weighted) {  // posted before the values' messages: MPI keeps one sender's messages in order
      check_ring_call(MPI_Irecv(&left_, 1, MPI_DOUBLE, mod(rank_ - 1), tag_, comm_, &weight_reqs_[0]), "MPI_Irecv");
      check_ring_call(MPI_Isend(&pre_, 1, MPI_DOUBLE, mod(rank_ + 1), tag_, comm_, &weight_reqs_[1]), "MPI_Isend");
    }
    post();
  }

 public:
  /// Starts the compressed sum in place: buf[0, count) = post * (sum over ranks of pre * buf + residual),
  /// the values crossing as 16-bit W and added in T (WireRingOps). `residual` (or null) is this rank's
  /// error feedback: it gets what each of this rank's roundings dropped. Nothing is posted before a
  /// buffer is lent: the first send is converted into it. The sum holds its buffer to the end (its
  /// allgather receives 16-bit values too).
  /// With Half::reduce_scatter (a sharded step), only this rank's segment ends holding the sum.
  template <class W, class T>
  void start_wire(T* buf, int count, T pre, T post, T* residual, MPI_Comm comm, int rank, int size, int tag,
                  std::uint64_t order, Half half = Half::both) {
    busy_ = true;
    one_region(buf, count);
    res_ = reinterpret_cast<unsigned char*>(residual);
    n_ = std::size_t(count);
    type_ = MPI_UINT16_T;
    elem_ = sizeof(T);
    op_ = MPI_OP_NULL;
    pre_ = double(pre);
    factor_ = double(post);
    sum_scale_ = nullptr;
    wire_ = &wire_ring_ops<W, T>;
    non_finite_ = -1;
    begin_on(comm, rank, size, tag, order);
    if (half == Half::reduce_scatter) {  // as start_sum's: rank r owns segment r
      rot_ = size_ - 1;
      end_step_ = size_ - 1;
    }
  }

  /// Without a buffer and needing one: in the reduce-scatter (its send is posted), or a compressed
  /// sum not yet begun.
  bool wants_buffer() const { return busy_ && !has_buffer_ && (wire_ != nullptr || (step_ < size_ - 1 && !reduced_)); }
  bool has_buffer() const { return has_buffer_; }
  /// What its buffer must hold: the widest segment, or for a compressed sum two of them in 16 bits
  /// (one received while the other is sent).
  std::size_t buffer_bytes() const {
    const std::size_t seg = (n_ + std::size_t(size_) - 1) / std::size_t(size_);
    return wire_ ? 2 * seg * sizeof(std::uint16_t) : seg * elem_;
  }
  std::uint64_t order() const { return order_; }
  /// Of a finished compressed sum: the first value (from buf) that is not finite (fp16), or -1.
  std::int64_t non_finite() const { return non_finite_; }

  /// Takes a buffer of at least buffer_bytes() and posts the waiting receive (a compressed sum: its
  /// first step).
  void lend(std::vector<unsigned char> buffer) {
    tmp_ = std::move(buffer);
    has_buffer_ = true;
    if (wire_)
      post_wire();
    else
      post_receive();
  }
  /// The buffer back once the last received segment is reduced (a compressed sum: once done), or
  /// an empty vector before.
  std::vector<unsigned char> give_back() {
    if (wire_ && (!has_buffer_ || busy_)) return {};
    if (!wire_ && (!has_buffer_ || step_ < size_ - 2 || (step_ == size_ - 2 && !reduced_))) return {};
    has_buffer_ = false;
    return std::move(tmp_);
  }

  /// The step's requests (receives, then sends: one per piece), for RingPool's batched test.
  MPI_Request* requests() { return reqs_.data(); }
  std::size_t num_requests() const { return reqs_.size(); }

  /// Moves on through the steps whose requests a test has completed (set to MPI_REQUEST_NULL):
  /// reduces a received segment once the step's messages are through and posts the next step.
  /// Calls no MPI progress itself.
  void advance_tested() {
    if (wire_) return advance_wire();
    while (busy_) {
      if (step_ < size_ - 1 && !reduced_) {  // reduce-scatter: add the received segment into ours
        // After the step's send too: reducing while it was still in flight made about one step in
        // three 80 us slower on Open MPI 4.1's shared memory (DLRM's MLP, 2 ranks: a bimodal step
        // time, 0.23 or 0.31 ms; never once the reduction waits; docs/BENCHMARKS.md).
        if (!has_buffer_ || !done(0) || !done(1)) return;
        const int seg = mod(rank_ - step_ - 1);
        // Weighted, the first segment received is the neighbour's raw values: its weight, sent
        // ahead of them on the same tag, is in (a completed receive, or one about to complete).
        double left = 1.0;
        if (step_ == 0 && weight_reqs_[0] != MPI_REQUEST_NULL) {
          check_ring_call(MPI_Wait(&weight_reqs_[0], MPI_STATUS_IGNORE), "MPI_Wait (the neighbour's weight)");
          left = left_;
        }
        const bool last = step_ == size_ - 2;  // the last addition: the segment is ours
        pieces(seg, [&](unsigned char* at, std::size_t n, std::size_t off) {
          const unsigned char* in = tmp_.data() + off * elem_;
          if (last && sum_scale_ != nullptr)
            sum_scale_(at, in, n, factor_, pre_, left);
          else if (weigh_ != nullptr)
            weigh_(at, in, n, pre_, left);
          else
            check_ring_call(MPI_Reduce_local(in, at, int(n), type_, op_), "MPI_Reduce_local");
        });
        reduced_ = true;
      }
      if (!done(0) || !done(1)) return;
      reduced_ = false;
      if (++step_ == end_step_) {
        // The weight's send: the right neighbour received the values sent after it long ago.
        if (weight_reqs_[1] != MPI_REQUEST_NULL)
          check_ring_call(MPI_Wait(&weight_reqs_[1], MPI_STATUS_IGNORE), "MPI_Wait (this rank's weight)");
        busy_ = false;
      } else {
        post();
      }
    }
  }

 private:
  // Where and as which step a sum starts (start and start_wire alike).
  void begin_on(MPI_Comm comm, int rank, int size, int tag, std::uint64_t order) {
    comm_ = comm;
    rank_ = rank;
    size_ = size;
    tag_ = tag;
    order_ = order;
    step_ = 0;
    end_step_ = 2 * (size - 1);
    rot_ = 0;
    reduced_ = false;
  }

  // The whole buffer as one region (a plain sum, or a compressed one).
  template <class T>
  void one_region(T* buf, int count) {
    regions_.assign(1, Region{reinterpret_cast<unsigned char*>(buf), std::size_t(count)});
    reqs_.assign(2, MPI_REQUEST_NULL);
  }
  // The requests: receives in [0, k), sends in [k, 2k), k the most pieces a segment can have.
  std::size_t max_pieces() const { return reqs_.size() / 2; }
  bool done(int sends) const {
    const std::size_t k = max_pieces(), at = std::size_t(sends) * k;
    for (std::size_t i = at; i < at + k; ++i)
      if (reqs_[i] != MPI_REQUEST_NULL) return false;
    return true;
  }
  // f(address, values, offset in the segment) for each region's part of segment `seg`, in order.
  template <class F>
  void pieces(int seg, F&& f) const {
    const std::size_t lo = begin(seg), hi = end(seg);
    std::size_t at = 0;
    for (const Region& r : regions_) {
      const std::size_t a = std::max(lo, at), b = std::min(hi, at + r.count);
      if (a < b) f(r.data + (a - at) * elem_, b - a, a - lo);
      at += r.count;
      if (at >= hi) return;
    }
  }

  int mod(int x) const { return ((x % size_) + size_) % size_; }
  // Ring segment seg is the buffer's segment (seg + rot_) mod p, cut at i * n / p.
  std::size_t bound(int i) const { return std::size_t(i) * n_ / std::size_t(size_); }
  std::size_t begin(int seg) const { return bound((seg + rot_) % size_); }
  std::size_t end(int seg) const { return bound((seg + rot_) % size_ + 1); }
  int len(int seg) const { return int(end(seg) - begin(seg)); }

  // Step s < p-1 (reduce-scatter): send segment r-s, receive segment r-s-1 into the buffer. Step
  // p-1+s (allgather): send segment r-s+1, which this rank completed last step, and receive
  // segment r-s in place. One tag per operation; MPI keeps one sender's messages in order.
  void post() {
    const int s = step_ < size_ - 1 ? step_ : step_ - (size_ - 1) - 1;
    const int send_seg = mod(rank_ - s);
    if (step_ >= size_ - 1 || has_buffer_) post_receive();
    MPI_Request* r = reqs_.data() + max_pieces();
    pieces(send_seg, [&](unsigned char* p, std::size_t n, std::size_t) {
      check_ring_call(MPI_Isend(p, int(n), type_, mod(rank_ + 1), tag_, comm_, r++), "MPI_Isend");
    });
  }
  void post_receive() {
    const bool scatter = step_ < size_ - 1;
    const int recv_seg = scatter ? mod(rank_ - step_ - 1) : mod(rank_ - (step_ - (size_ - 1)));
    MPI_Request* r = reqs_.data();
    pieces(recv_seg, [&](unsigned char* p, std::size_t n, std::size_t off) {
      unsigned char* into = scatter ? tmp_.data() + off * elem_ : p;
      check_ring_call(MPI_Irecv(into, int(n), type_, mod(rank_ - 1), tag_, comm_, r++), "MPI_Irecv");
    });
  }

  // A compressed sum: step k receives into half(k) and sends from half(k + 1). The reduce-scatter's
  // first send is this rank's segment converted; each later one is the segment received and added
  // to in the step before (in place in its half); the allgather forwards what it received.
  std::uint16_t* half(int k) {
    const std::size_t seg = (n_ + std::size_t(size_) - 1) / std::size_t(size_);
    return reinterpret_cast<std::uint16_t*>(tmp_.data()) + std::size_t(k % 2) * seg;
  }
  unsigned char* values(int seg) const { return regions_[0].data + begin(seg) * elem_; }
  unsigned char* residual(int seg) const { return res_ ? res_ + begin(seg) * elem_ : nullptr; }

  void post_wire() {
    const bool scatter = step_ < size_ - 1;
    const int s = scatter ? step_ : step_ - (size_ - 1) - 1;
    const int send_seg = mod(rank_ - s);
    const int recv_seg = scatter ? mod(rank_ - step_ - 1) : mod(rank_ - (step_ - (size_ - 1)));
    std::uint16_t* out = half(step_ + 1);
    if (step_ == 0) wire_->first(values(send_seg), out, residual(send_seg), pre_, std::size_t(len(send_seg)));
    check_ring_call(MPI_Irecv(half(step_), len(recv_seg), MPI_UINT16_T, mod(rank_ - 1), tag_, comm_, &reqs_[0]),
                    "MPI_Irecv");
    check_ring_call(MPI_Isend(out, len(send_seg), MPI_UINT16_T, mod(rank_ + 1), tag_, comm_, &reqs_[1]), "MPI_Isend");
  }

  void advance_wire() {
    while (busy_) {
      if (!has_buffer_) return;  // not begun: lend() posts the first step
      if (!reduced_) {
        if (reqs_[0] != MPI_REQUEST_NULL) return;
        std::uint16_t* in = half(step_);
        std::int64_t bad = -1;
        int seg = 0;
        if (step_ < size_ - 1) {
          seg = mod(rank_ - step_ - 1);
          const std::size_t n = std::size_t(len(seg));
          if (step_ == size_ - 2)  // the last addition: the segment is ours
            bad = wire_->finish(values(seg), in, residual(seg), pre_, factor_, n);
          else
            wire_->add(values(seg), in, residual(seg), pre_, n);
        } else {
          seg = mod(rank_ - (step_ - (size_ - 1)));
          bad = wire_->write(values(seg), in, factor_, std::size_t(len(seg)));
        }
        // Both halves: every rank sees every final value once, in some order, so the smallest index is
        // the same everywhere. The reduce-scatter alone sees its own slice's (the sync agrees on them).
        if (bad >= 0) {
          const std::int64_t at = std::int64_t(begin(seg)) + bad;
          non_finite_ = non_finite_ < 0 ? at : std::min(non_finite_, at);
        }
        reduced_ = true;
      }
      if (reqs_[1] != MPI_REQUEST_NULL) return;
      reduced_ = false;
      if (++step_ == end_step_)
        busy_ = false;
      else
        post_wire();
    }
  }

  // The last addition and the factor in one pass: (ours + received) * factor. The same bits as
  // MPI_SUM followed by the multiplication (IEEE addition is commutative), one memory pass fewer.
  template <class T>
  static void sum_scale(unsigned char* ours, const unsigned char* received, std::size_t n, double factor, double pre,
                        double left) {
    // exact: factor and the weights came from a T
    if (pre == 1.0 && left == 1.0)
      sum_scale_loop(reinterpret_cast<T*>(ours), reinterpret_cast<const T*>(received), n, T(factor));
    else
      weighted_sum_scale_loop(reinterpret_cast<T*>(ours), reinterpret_cast<const T*>(received), n, T(factor), T(pre),
                              T(left));
  }
  // An addition before the last, weighted: ours = pre * ours + left * received.
  template <class T>
  static void weighted_add(unsigned char* ours, const unsigned char* received, std::size_t n, double pre, double left) {
    T* v = reinterpret_cast<T*>(ours);
    const T* w = reinterpret_cast<const T*>(received);
    const T p = T(pre), q = T(left);
    for (std::size_t i = 0; i < n; ++i) v[i] = p * v[i] + q * w[i];
  }

  bool busy_ = false, has_buffer_ = false, reduced_ = false;
  std::vector<Region> regions_;   // what the sum runs over (one region but for start_regions)
  unsigned char* res_ = nullptr;  // compressed: this rank's residuals (error feedback), or null
  std::size_t n_ = 0, elem_ = 0;
  double factor_ = 1, pre_ = 1;
  double left_ = 1;  // weighted: the left neighbour's weight (received into it)
  MPI_Request weight_reqs_[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // weighted: its receive, our send
  const WireRingOps* wire_ = nullptr;  // compressed: the conversions; null for a sum of T's
  std::int64_t non_finite_ = -1;
  void (*sum_scale_)(unsigned char*, const unsigned char*, std::size_t, double, double, double) = nullptr;
  void (*weigh_)(unsigned char*, const unsigned char*, std::size_t, double, double) = nullptr;  // weighted
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  MPI_Op op_ = MPI_SUM;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, tag_ = 0, step_ = 0;
  int end_step_ = 0, rot_ = 0;  // the step after the last (2(p - 1) for both halves); segment rotation
  std::uint64_t order_ = 0;
  std::vector<MPI_Request> reqs_ = std::vector<MPI_Request>(2, MPI_REQUEST_NULL);  // see max_pieces()
  std::vector<unsigned char> tmp_;
};

/// The ring states of one communicator, reused so that steady-state syncs allocate nothing, the
/// tag sequence every rank advances identically (ranks issue the same operations in order), and
/// the reduce-scatter receive buffers.
///
/// Buffers: at most kBuffers receives into a temporary are posted at once, however many sums are
/// in flight, so the few buffers stay in cache between a segment's arrival and its reduction (one
/// per sum outgrows the last-level cache with many sums in flight; docs/BENCHMARKS.md).
/// Buffers go to the waiting sums in the order the sums started, the same on every rank, so a
/// rank's oldest unfinished sums always get theirs: a sum that holds one waits only for its
/// peer's send, which its peer posted when it started that sum.
class RingPool {
 public:
  /// Starts a sum on a state no request holds (a finished sum stays with its request until
  /// tested) and not busy.
  template <class T>
  std::shared_ptr<RingAllreduce> start(T* buf, int count, double factor, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                                       int rank, int size, bool weighted = false, double pre = 1.0) {
    std::shared_ptr<RingAllreduce> s = idle_state();
    s->start(buf, count, factor, type, op, comm, rank, size, next_tag(), ++started_, weighted, pre);
    lend();
    return s;
  }

  /// Starts a sum over regions (RingAllreduce::start_regions).
  template <class T, class R>
  std::shared_ptr<RingAllreduce> start_regions(const R* regions, std::size_t k, double factor, MPI_Datatype type,
                                               MPI_Op op, MPI_Comm comm, int rank, int size,
                                               RingAllreduce::Half half = RingAllreduce::Half::both,
                                               bool weighted = false, double pre = 1.0) {
    std::shared_ptr<RingAllreduce> s = idle_state();
    s->template start_regions<T>(regions, k, factor, type, op, comm, rank, size, next_tag(), ++started_, half, weighted,
                                 pre);
    lend();
    return s;
  }

  /// Starts a compressed sum in place (RingAllreduce::start_wire).
  template <class W, class T>
  std::shared_ptr<RingAllreduce> start_wire(T* buf, int count, T pre, T post, T* residual, MPI_Comm comm, int rank,
                                            int size, RingAllreduce::Half half = RingAllreduce::Half::both) {
    std::shared_ptr<RingAllreduce> s = idle_state();
    s->template start_wire<W>(buf, count, pre, post, residual, comm, rank, size, next_tag(), ++started_, half);
    lend();
    return s;
  }

  /// Advances every sum in flight: a ring moves on only when tested, so testing one request
  /// advances them all, and later chunks do not idle while the sync waits for an earlier one.
  /// One MPI_Testsome over all their requests: each MPI test runs the progress engine once, so
  /// testing ring by ring polled it once per sum in flight (docs/BENCHMARKS.md has the cost).
  void progress() {
    held_.clear();
    reqs_.clear();
    for (auto& s : states_)
      if (held(s)) {
        held_.push_back(s.get());
        reqs_.insert(reqs_.end(), s->requests(), s->requests() + s->num_requests());
      }
    if (held_.empty()) return;
    int completed = 0;
    indices_.resize(reqs_.size());
    check_ring_call(MPI_Testsome(int(reqs_.size()), reqs_.data(), &completed, indices_.data(), MPI_STATUSES_IGNORE),
                    "MPI_Testsome");
    bool returned = false;
    std::size_t at = 0;
    for (std::size_t i = 0; i < held_.size(); ++i) {
      const std::size_t k = held_[i]->num_requests();
      std::copy_n(&reqs_[at], k, held_[i]->requests());  // completed ones are MPI_REQUEST_NULL now
      at += k;
      held_[i]->advance_tested();
      std::vector<unsigned char> b = held_[i]->give_back();
      if (!b.empty()) spare_.push_back(fit(std::move(b))), returned = true;
    }
    if (returned) lend();  // a sum waits for a buffer only from its start (lent then) to a return
  }

 private:
  static constexpr int kBuffers = 4;
  static constexpr std::uint32_t kTags = 16384;  // below MPI's guaranteed MPI_TAG_UB of 32767

  // In flight and held by a request: an abandoned sum is never tested again, and keeps its buffer
  // (its messages may still arrive) out of the count.
  static bool held(const std::shared_ptr<RingAllreduce>& s) { return s.use_count() > 1 && s->busy(); }

  std::shared_ptr<RingAllreduce> idle_state() {
    for (auto& s : states_)
      if (s.use_count() == 1 && !s->busy()) return s;
    states_.push_back(std::make_shared<RingAllreduce>());
    return states_.back();
  }

  int next_tag() {
    seq_ = (seq_ + 1) % kTags;
    return 1 + int(seq_);
  }

  // Gives free buffers to the waiting sums, oldest first.
  void lend() {
    int lent = 0;
    for (auto& s : states_) lent += held(s) && s->has_buffer();
    for (; lent < kBuffers; ++lent) {
      RingAllreduce* oldest = nullptr;
      for (auto& s : states_)
        if (held(s) && s->wants_buffer() && (!oldest || s->order() < oldest->order())) oldest = s.get();
      if (!oldest) return;
      if (oldest->buffer_bytes() > buffer_bytes_) {
        buffer_bytes_ = oldest->buffer_bytes();
        for (auto& b : spare_) b = fit(std::move(b));
      }
      std::vector<unsigned char> b;
      if (!spare_.empty()) {
        b = std::move(spare_.back());  // the most recently used: the likeliest in cache
        spare_.pop_back();
      }
      oldest->lend(fit(std::move(b)));
    }
  }

  // Every buffer grows to the largest segment seen, whichever sums it served: once each buffer
  // has been lent and returned (the first sync), steady-state syncs allocate nothing.
  std::vector<unsigned char> fit(std::vector<unsigned char> b) const {
    if (b.size() < buffer_bytes_) b.resize(buffer_bytes_);
    return b;
  }

  std::uint32_t seq_ = 0;
  std::uint64_t started_ = 0;
  std::vector<std::shared_ptr<RingAllreduce>> states_;
  std::vector<std::vector<unsigned char>> spare_;  // buffers not lent
  std::size_t buffer_bytes_ = 0;                   // the size of every buffer once returned
  // One batched test's operands; they grow, then stay: steady-state syncs allocate nothing.
  std::vector<RingAllreduce*> held_;
  std::vector<MPI_Request> reqs_;
  std::vector<int> indices_;
};

}  // namespace gradsync::impl
