// gradsync internals: Options::tuning.timeline (GRADSYNC_TIMELINE), a Chrome trace of every synchronize()
// (docs/TIMELINE.md).
//
// Events are appended to a vector reserved once: recording one is two clock reads and a store, no
// allocation and no formatting. Names (tensors, chunks) are interned when the plan is built and
// referred to by index; the JSON is written when the buffer fills (checked between steps), on
// flush(), when the sync fails (before a throw or MPI_Abort) and at destruction. After every write
// the file is complete JSON ("]}" is rewritten at its end), so even a process that aborts leaves a
// readable trace. Timestamps are steady_clock microseconds, the same clock for every rank on a host,
// so per-rank files line up when merged.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "stall.hpp"

namespace gradsync::impl {

/// A copy of Options::tuning.timeline's string that lives as long as the process (options() hands it
/// out): the paths of a process are few. Null for null or empty.
inline const char* keep_timeline_path(const char* p) {
  if (!p || !*p) return nullptr;
  static std::mutex m;
  static auto* kept = new std::set<std::string>();  // intentionally leaked
  std::lock_guard<std::mutex> lock(m);
  return kept->insert(p).first->c_str();
}

/// Where a rank writes its trace: `path` itself on one rank, else `path` with ".rank<r>" inserted
/// before its extension ("t.json" -> "t.rank1.json"; "trace" -> "trace.rank1").
inline std::string timeline_path(const std::string& path, int rank, int ranks, const char* what = ".rank") {
  if (ranks == 1) return path;
  const std::string tag = what + std::to_string(rank);
  const std::size_t slash = path.find_last_of('/');
  const std::size_t base = slash == std::string::npos ? 0 : slash + 1;
  const std::size_t dot = path.find_last_of('.');
  if (dot == std::string::npos || dot <= base) return path + tag;  // no extension (or a dot file)
  return path.substr(0, dot) + tag + path.substr(dot);
}

class Timeline {
 public:
  // Lanes (Chrome "tid"): the host's API calls and waits, the pack and unpack kernels, and one lane
  // per chunk in flight (chunk c on reduce + c % in_flight: chunk c + in_flight launches only after
  // chunk c completed, so spans never overlap within a lane).
  enum Lane : int { host = 0, pack = 1, unpack = 2, reduce = 10 };
  enum class Kind : std::uint8_t { call, plan, pack, unpack, reduce, wait, mark, warning, failure, tune, local };

  struct Event {
    const char* name;
    std::int64_t ts, dur;  // ns; dur < 0: an instant
    std::int64_t a, b;     // kind-specific (chunk, bytes, call number, ...)
    double x;              // kind-specific (seconds)
    const char* s;         // a static string (algorithm)
    std::int32_t str;      // an interned string, or -1
    std::int32_t tid;
    Kind kind;
    bool flag;  // reduce: in place; tune: settled
  };

  Timeline(const std::string& path, int rank, int ranks) : rank_(rank) {
    // Another GradientSync of this process writing to the same path (GRADSYNC_TIMELINE applies to
    // every sync): this one writes PATH with ".sync<k>" before the extension, k its number among them.
    {
      std::lock_guard<std::mutex> lock(live_mutex());
      auto& used = live()[path];
      while (std::find(used.begin(), used.end(), sync_) != used.end()) ++sync_;
      used.push_back(sync_);
    }
    base_ = path;
    path_ = timeline_path(sync_ == 1 ? path : timeline_path(path, sync_, -1, ".sync"), rank, ranks);
    file_ = std::fopen(path_.c_str(), "w");
    if (!file_) release();
    if (!file_)
      throw ConfigError(cat("Options::tuning.timeline (GRADSYNC_TIMELINE): cannot write '", path_, "' on rank ", rank));
    events_.reserve(capacity);
    std::fputs("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n", file_);
    const char* lanes[] = {"host: synchronize, checks, plan, waits", "pack", "unpack"};
    meta("process_name", -1, cat("rank ", rank));
    meta_int("process_sort_index", -1, rank);
    for (int t = 0; t < 3; ++t) meta("thread_name", t, lanes[t]);
    flush();
  }
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;
  ~Timeline() {
    flush();
    std::fclose(file_);
    release();
  }

  const std::string& path() const { return path_; }
  static std::int64_t now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // ---- recording (no allocation while the buffer has room) ----

  void span(Kind k, const char* name, std::int64_t t0, std::int64_t a = -1, std::int64_t b = -1) {
    push(Event{name, t0, std::max<std::int64_t>(0, now() - t0), a, b, 0, nullptr, -1, host, k, false});
  }
  // synchronize() call `call`, begun at t0 (then, between steps, the buffer may be written out).
  void step_span(std::int64_t t0, std::uint64_t call) {
    span(Kind::call, "synchronize", t0, std::int64_t(call));
    step_done();
  }
  void chunk_span(Kind k, std::size_t c, std::int64_t t0) {
    push(Event{k == Kind::pack ? "pack" : "unpack", t0, std::max<std::int64_t>(0, now() - t0), std::int64_t(c),
               bytes_of(c), 0, nullptr, names_of(c), k == Kind::pack ? pack : unpack, k, false});
  }
  // The backend starts chunk c's reduction now.
  void reduce_begin(std::size_t c) {
    if (c < start_.size()) start_[c] = now();
  }
  // Chunk c's reduction completed; the host waited for it since `waited_from` (0: did not wait).
  void reduce_end(std::size_t c, std::int64_t waited_from) {
    if (c >= start_.size()) return;
    const std::int64_t t = now();
    if (waited_from > 0 && t - waited_from >= min_wait_ns)  // not the fast path (already complete)
      push(Event{"wait", waited_from, t - waited_from, std::int64_t(c), -1, 0, nullptr, -1, host, Kind::wait, false});
    push(Event{"allreduce", start_[c], std::max<std::int64_t>(0, t - start_[c]), std::int64_t(c), bytes_of(c), 0,
               algorithm_, names_of(c), reduce + int(c % std::size_t(lanes_)), Kind::reduce, in_place_[c] != 0});
  }
  // mark_ready of data-parallel tensor i (fused order).
  void mark(std::int64_t i) {
    const std::int32_t s = i >= 0 && std::size_t(i) < tensor_names_.size() ? tensor_names_[std::size_t(i)] : -1;
    push(Event{"mark_ready", now(), -1, i, -1, 0, nullptr, s, host, Kind::mark, false});
  }
  void tuned(double seconds, std::size_t chunk_bytes, const char* algorithm, bool settled) {
    push(Event{"tuning", now(), -1, std::int64_t(chunk_bytes), -1, seconds, algorithm, -1, host, Kind::tune, settled});
  }
  // A stall warning (final = false), or the report of the error about to be thrown (or aborted on).
  void report(ErrorKind k, bool final_report, const std::string& msg) {
    const bool warning = !final_report && k == ErrorKind::stall;
    const char* name = warning                    ? "stall warning"
                       : k == ErrorKind::stall    ? "StallError"
                       : k == ErrorKind::mismatch ? "MismatchError"
                                                  : "Error";
    // "... missing ranks: [2] (arrived ...": the ranks, for the viewer's argument list.
    std::string missing;
    const std::size_t m = msg.find("missing ranks: ");
    if (m != std::string::npos) missing = msg.substr(m + 15, msg.find(']', m) + 1 - (m + 15));
    push(Event{name, now(), -1, -1, intern(missing), 0, nullptr, intern(msg), host,
               warning ? Kind::warning : Kind::failure, false});
    if (final_report) flush();  // an abort may follow; a throw may never be caught
  }
  // Control's observer (stall.hpp): stall warnings and final reports.
  static void observe(void* self, ErrorKind k, bool final_report, const std::string& msg) {
    static_cast<Timeline*>(self)->report(k, final_report, msg);
  }

  /// Interns the plan's names: `names[i]` is data-parallel tensor i's in fused order, `chunks[i]`
  /// its chunks [first, last]; chunk_info(c) gives chunk c's {bytes, reduced in place}.
  template <class ChunkInfo>
  void plan(const std::vector<std::string>& names, const std::vector<std::pair<std::int64_t, std::int64_t>>& chunks,
            std::size_t nchunks, ChunkInfo&& chunk_info, const char* algorithm, int lanes) {
    algorithm_ = algorithm;
    lanes_ = std::max(1, lanes);
    std::vector<std::string> members(nchunks);
    tensor_names_.assign(names.size(), -1);
    for (std::size_t i = 0; i < names.size(); ++i) {
      tensor_names_[i] = intern(names[i]);
      for (std::int64_t c = chunks[i].first; c <= chunks[i].second; ++c)
        members[std::size_t(c)] += (members[std::size_t(c)].empty() ? "" : ", ") + names[i];
    }
    chunk_names_.assign(nchunks, -1);
    chunk_bytes_.assign(nchunks, 0);
    in_place_.assign(nchunks, 0);
    start_.assign(nchunks, 0);
    for (std::size_t c = 0; c < nchunks; ++c) {
      chunk_names_[c] = intern(members[c]);
      const auto info = chunk_info(c);
      chunk_bytes_[c] = std::int64_t(info.first);
      in_place_[c] = info.second;
    }
    for (; lanes_named_ < lanes_; ++lanes_named_)
      meta("thread_name", reduce + lanes_named_, cat("reduction ", lanes_named_));
  }

  // Between steps: writes the buffer out when it is half full (never inside a step's collectives).
  void step_done() {
    if (events_.size() >= capacity / 2) flush();
  }

  /// Writes the buffered events; the file is complete JSON afterwards.
  void flush() {
    if (!file_) return;
    if (end_ >= 0) std::fseek(file_, end_, SEEK_SET);
    std::string out;
    for (const Event& e : events_) {
      out.clear();
      write(e, out);
      std::fputs(first_ ? "" : ",\n", file_);
      std::fputs(out.c_str(), file_);
      first_ = false;
    }
    for (const std::string& m : pending_meta_) {
      std::fputs(first_ ? "" : ",\n", file_);
      std::fputs(m.c_str(), file_);
      first_ = false;
    }
    events_.clear();
    pending_meta_.clear();
    end_ = std::ftell(file_);
    std::fputs("\n]}\n", file_);
    std::fflush(file_);
  }

 private:
  // The paths written by live Timelines, and their sync numbers.
  static std::mutex& live_mutex() {
    static std::mutex m;
    return m;
  }
  static std::map<std::string, std::vector<int>>& live() {
    static auto* m = new std::map<std::string, std::vector<int>>();  // intentionally leaked
    return *m;
  }
  void release() {
    std::lock_guard<std::mutex> lock(live_mutex());
    auto& used = live()[base_];
    used.erase(std::find(used.begin(), used.end(), sync_));
  }

  static constexpr std::size_t capacity = std::size_t(1) << 15;
  static constexpr std::int64_t min_wait_ns = 2000;  // shorter waits found the chunk complete

  void push(const Event& e) {
    if (events_.size() == capacity) flush();  // only if a step records more than half the buffer
    events_.push_back(e);
  }
  std::int64_t bytes_of(std::size_t c) const { return c < chunk_bytes_.size() ? chunk_bytes_[c] : 0; }
  std::int32_t names_of(std::size_t c) const { return c < chunk_names_.size() ? chunk_names_[c] : -1; }
  std::int32_t intern(std::string s) {
    strings_.push_back(std::move(s));
    return std::int32_t(strings_.size() - 1);
  }

  static void escape(const std::string& s, std::string& out) {
    out += '"';
    for (char ch : s) {
      const unsigned char u = static_cast<unsigned char>(ch);
      if (ch == '"' || ch == '\\') {
        out += '\\';
        out += ch;
      } else if (u < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(u));
        out += buf;
      } else {
        out += ch;
      }
    }
    out += '"';
  }
  void meta(const char* what, int tid, const std::string& name) {
    std::string m = cat("{\"name\":\"", what, "\",\"ph\":\"M\",\"pid\":", rank_, tid >= 0 ? cat(",\"tid\":", tid) : "",
                        ",\"args\":{\"name\":");
    escape(name, m);
    pending_meta_.push_back(m + "}}");
  }
  void meta_int(const char* what, int tid, int v) {
    pending_meta_.push_back(cat("{\"name\":\"", what, "\",\"ph\":\"M\",\"pid\":", rank_,
                                tid >= 0 ? cat(",\"tid\":", tid) : "", ",\"args\":{\"sort_index\":", v, "}}"));
  }
  static std::string us(std::int64_t ns) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%lld.%03lld", static_cast<long long>(ns / 1000), static_cast<long long>(ns % 1000));
    return buf;
  }
  std::string str(std::int32_t i) const { return i >= 0 ? strings_[std::size_t(i)] : std::string(); }

  void write(const Event& e, std::string& out) const {
    out += cat("{\"name\":\"", e.name, "\",\"ph\":\"", e.dur < 0 ? "i" : "X", "\",\"pid\":", rank_, ",\"tid\":", e.tid,
               ",\"ts\":", us(e.ts));
    if (e.dur >= 0) out += cat(",\"dur\":", us(e.dur));
    if (e.dur < 0) out += e.kind == Kind::failure ? ",\"s\":\"p\"" : ",\"s\":\"t\"";
    out += ",\"args\":{";
    switch (e.kind) {
      case Kind::call:
        out += cat("\"call\":", e.a);
        break;
      case Kind::plan:
        out += cat("\"chunks\":", e.a, ",\"bytes\":", e.b);
        break;
      case Kind::local:
        out += cat("\"segments\":", e.a);
        break;
      case Kind::pack:
      case Kind::unpack:
      case Kind::reduce:
        out += cat("\"chunk\":", e.a, ",\"bytes\":", e.b, ",\"tensors\":");
        escape(str(e.str), out);
        if (e.kind == Kind::reduce) out += cat(",\"algorithm\":\"", e.s, "\",\"in_place\":", e.flag ? "true" : "false");
        break;
      case Kind::wait:
        out += cat("\"chunk\":", e.a);
        break;
      case Kind::mark:
        out += "\"tensor\":";
        escape(str(e.str), out);
        break;
      case Kind::warning:
      case Kind::failure:
        out += "\"missing_ranks\":";
        escape(str(std::int32_t(e.b)), out);
        out += ",\"report\":";
        escape(str(e.str), out);
        break;
      case Kind::tune:
        out += cat("\"step_seconds\":", e.x, ",\"chunk_bytes\":", e.a, ",\"algorithm\":\"", e.s,
                   "\",\"settled\":", e.flag ? "true" : "false");
        break;
    }
    out += "}}";
  }

  std::string base_, path_;
  int sync_ = 1;  // among this process's live syncs writing to base_
  int rank_ = 0;
  std::FILE* file_ = nullptr;
  long end_ = -1;      // where "]}" starts in the file
  bool first_ = true;  // no event written yet
  std::vector<Event> events_;
  std::vector<std::string> strings_, pending_meta_;
  std::vector<std::int32_t> tensor_names_, chunk_names_;
  std::vector<std::int64_t> chunk_bytes_, start_;
  std::vector<char> in_place_;
  const char* algorithm_ = "flat";
  int lanes_ = 1, lanes_named_ = 0;
};

/// A span on the host lane (or a chunk's pack/unpack lane) from construction to destruction; does
/// nothing when the timeline is off (a null pointer: one compare).
class TimelineScope {
 public:
  TimelineScope(Timeline* t, Timeline::Kind k, const char* name, std::int64_t a = -1, std::int64_t b = -1)
      : t_(t), name_(name), a_(a), b_(b), k_(k) {
    if (t_) t0_ = Timeline::now();
  }
  ~TimelineScope() {
    if (!t_) return;
    if (k_ == Timeline::Kind::pack || k_ == Timeline::Kind::unpack)
      t_->chunk_span(k_, std::size_t(a_), t0_);
    else
      t_->span(k_, name_, t0_, a_, b_);
  }
  TimelineScope(const TimelineScope&) = delete;
  TimelineScope& operator=(const TimelineScope&) = delete;

 private:
  Timeline* t_;
  const char* name_;
  std::int64_t a_, b_, t0_ = 0;
  Timeline::Kind k_;
};

/// Options::tuning.timeline's trace for this rank, observing the side channel's reports; null when off.
template <class Control>
std::unique_ptr<Timeline> open_timeline(const char* path, int rank, int ranks, Control& ctl) {
  if (!path || !*path) return nullptr;
  auto t = std::make_unique<Timeline>(path, rank, ranks);
  ctl.observe(&Timeline::observe, t.get());
  return t;
}

}  // namespace gradsync::impl
