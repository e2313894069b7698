// Options::tuning.timeline (GRADSYNC_TIMELINE): each rank's Chrome trace parses as JSON (a strict reader
// below: malformed output fails), spans have dur >= 0 and nest within their lane, the bytes of the
// reduction spans sum to stats().bytes_allreduced, their tensor names are the registered ones,
// mark_ready leaves one instant per tensor, a stall leaves its warning with the missing rank, and a
// sync without the option writes nothing.
#include <gradsync/gradsync.hpp>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gradsync_test.hpp"

using gradsync_test::all_ranks;
using gradsync_test::has;
using gradsync_test::world_rank;
using gradsync_test::world_size;

namespace {
struct Dense {};
struct Tables {};
}  // namespace

template <>
struct gradsync::LocalVarPolicy<Tables> : gradsync::KeepLocal<gradsync::LocalScale::world_size> {};

namespace {

using View = Kokkos::View<double*>;
using Sync = gradsync::GradientSync<gradsync::MpiBackend, View>;

// ---- a strict JSON reader (RFC 8259 subset gradsync writes: no \u surrogates needed) ----
struct Json {
  enum Type { null, boolean, number, string, array, object } type = null;
  bool b = false;
  double num = 0;
  std::string str;
  std::vector<Json> items;
  std::map<std::string, Json> fields;
  const Json* get(const std::string& k) const {
    auto it = fields.find(k);
    return it == fields.end() ? nullptr : &it->second;
  }
};

struct JsonReader {
  const std::string& s;
  std::size_t i = 0;
  [[noreturn]] void bad(const char* what) const {
    throw std::runtime_error(std::string("malformed JSON at ") + std::to_string(i) + ": " + what);
  }
  void ws() {
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) ++i;
  }
  void expect(char c) {
    ws();
    if (i >= s.size() || s[i] != c) bad("unexpected character");
    ++i;
  }
  std::string string_() {
    expect('"');
    std::string out;
    for (;;) {
      if (i >= s.size()) bad("unterminated string");
      const char c = s[i++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) bad("control character in string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i >= s.size()) bad("bad escape");
      const char e = s[i++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out += e;
          break;
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'u': {
          if (i + 4 > s.size()) bad("bad \\u escape");
          out += char(std::stoi(s.substr(i, 4), nullptr, 16));
          i += 4;
          break;
        }
        default:
          bad("bad escape");
      }
    }
  }
  Json value() {
    ws();
    if (i >= s.size()) bad("unexpected end");
    Json j;
    const char c = s[i];
    if (c == '{') {
      j.type = Json::object;
      ++i;
      ws();
      if (i < s.size() && s[i] == '}') return ++i, j;
      for (;;) {
        std::string k = string_();
        expect(':');
        j.fields[k] = value();
        ws();
        if (i < s.size() && s[i] == ',') {
          ++i;
          continue;
        }
        expect('}');
        return j;
      }
    }
    if (c == '[') {
      j.type = Json::array;
      ++i;
      ws();
      if (i < s.size() && s[i] == ']') return ++i, j;
      for (;;) {
        j.items.push_back(value());
        ws();
        if (i < s.size() && s[i] == ',') {
          ++i;
          continue;
        }
        expect(']');
        return j;
      }
    }
    if (c == '"') {
      j.type = Json::string;
      j.str = string_();
      return j;
    }
    for (const char* lit : {"true", "false", "null"})
      if (s.compare(i, std::strlen(lit), lit) == 0) {
        i += std::strlen(lit);
        j.type = lit[0] == 'n' ? Json::null : Json::boolean;
        j.b = lit[0] == 't';
        return j;
      }
    const std::size_t start = i;
    if (s[i] == '-') ++i;
    if (i >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i]))) bad("not a value");
    while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.' || s[i] == 'e' ||
                            s[i] == 'E' || s[i] == '+' || s[i] == '-'))
      ++i;
    j.type = Json::number;
    j.num = std::stod(s.substr(start, i - start));
    return j;
  }
  Json document() {
    Json j = value();
    ws();
    if (i != s.size()) bad("trailing characters");
    return j;
  }
};

Json parse(const std::string& text) {
  JsonReader r{text};
  return r.document();
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// A fresh folder, the same on every rank (rank 0 creates it).
std::string temp_dir() {
  char buf[256] = {};
  if (world_rank() == 0) {
    std::string t = "/tmp/gradsync_timeline_XXXXXX";
    std::snprintf(buf, sizeof buf, "%s", t.c_str());
    if (!::mkdtemp(buf)) buf[0] = '\0';
  }
  MPI_Bcast(buf, sizeof buf, MPI_CHAR, 0, MPI_COMM_WORLD);
  REQUIRE(buf[0] != '\0');
  return buf;
}

// This rank's file for base path `p`.
std::string rank_file(const std::string& p) { return gradsync::impl::timeline_path(p, world_rank(), world_size()); }

struct Trace {
  std::vector<const Json*> events;
  Json doc;
};

// Parses the trace and checks what holds for every trace: events are objects with name, ph, pid
// (this rank), tid and ts; spans have dur >= 0 and nest within their lane.
bool well_formed_as(const std::string& text, Json& doc, std::string& why, int rank);
bool well_formed(const std::string& text, Json& doc, std::string& why) {
  return well_formed_as(text, doc, why, world_rank());
}
bool well_formed_as(const std::string& text, Json& doc, std::string& why, int rank) {
  try {
    doc = parse(text);
  } catch (const std::exception& e) {
    why = e.what();
    return false;
  }
  const Json* ev = doc.get("traceEvents");
  if (!ev || ev->type != Json::array) return why = "no traceEvents array", false;
  std::map<int, std::vector<std::pair<double, double>>> lanes;  // tid -> spans
  for (const Json& e : ev->items) {
    const Json* ph = e.get("ph");
    const Json* pid = e.get("pid");
    if (!ph || !e.get("name") || !pid || pid->num != rank) return why = "event without ph/name/pid", false;
    if (ph->str == "M") continue;
    const Json* ts = e.get("ts");
    const Json* tid = e.get("tid");
    if (!ts || !tid) return why = "event without ts/tid", false;
    if (ph->str == "X") {
      const Json* dur = e.get("dur");
      if (!dur || dur->num < 0) return why = "span without dur >= 0: " + e.get("name")->str, false;
      lanes[int(tid->num)].push_back({ts->num, ts->num + dur->num});
    } else if (ph->str != "i") {
      return why = "unexpected ph " + ph->str, false;
    }
  }
  for (auto& [tid, spans] : lanes) {
    // Sorted by begin, longer first: each span lies inside the innermost open one, or after it.
    std::sort(spans.begin(), spans.end(),
              [](auto& a, auto& b) { return a.first < b.first || (a.first == b.first && a.second > b.second); });
    std::vector<double> open;   // ends of the enclosing spans
    const double eps = 0.0015;  // the file's resolution is 1 ns = 0.001 us
    for (const auto& sp : spans) {
      while (!open.empty() && open.back() <= sp.first + eps) open.pop_back();
      if (!open.empty() && sp.second > open.back() + eps)
        return why = "spans overlap in lane " + std::to_string(tid) + " at ts " + std::to_string(sp.first), false;
      open.push_back(sp.second);
    }
  }
  return true;
}

std::vector<const Json*> named(const Json& doc, const std::string& name) {
  std::vector<const Json*> out;
  for (const Json& e : doc.get("traceEvents")->items)
    if (e.get("name")->str == name) out.push_back(&e);
  return out;
}

std::vector<std::string> split_names(const std::string& s) {
  std::vector<std::string> out;
  std::size_t b = 0;
  while (b <= s.size() && !s.empty()) {
    const std::size_t e = s.find(", ", b);
    out.push_back(s.substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) break;
    b = e + 2;
  }
  return out;
}

gradsync::Options base_opts() {
  gradsync::Options o;
  o.tuning.read_environment = false;
  o.stall_timeout = 30;
  return o;
}

// Tensors of mixed sizes: several share a packed chunk, one is reduced in place, one is local.
struct Model {
  std::vector<View> g;
  std::vector<std::string> names;
  View local{"local", 8};
  explicit Model(int seed) {
    const std::size_t sizes[] = {3, 100, 40000, 17, 5000, 1};
    for (std::size_t k = 0; k < 6; ++k) {
      g.emplace_back("g" + std::to_string(k), sizes[k]);
      names.push_back("layer" + std::to_string(k) + (k % 2 ? ".weight \"w\"" : ".bias"));  // a quote: escaped
    }
    fill(seed);
  }
  void fill(int seed) {
    for (std::size_t k = 0; k < g.size(); ++k)
      gradsync_test::fill_host(g[k], [&](std::size_t i) { return double(seed + 1) * double(k + 1) + double(i % 7); });
    gradsync_test::fill_host(local, [&](std::size_t i) { return double(i); });
  }
  void add_to(Sync& s) {
    for (std::size_t k = 0; k < g.size(); ++k) s.add<Dense>(g[k], names[k]);
    s.add<Tables>(local, "table");
  }
};

// Runs `steps` synchronize() calls on a model (with mark_ready when asked), then checks the trace.
void check_run(gradsync::Options o, bool marks, int steps) {
  const std::string dir = temp_dir();
  const std::string base = dir + "/trace.json";
  o.tuning.timeline = base.c_str();
  Model m(world_rank());
  std::uint64_t bytes = 0;
  std::size_t calls = 0;
  {
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    m.add_to(sync);
    for (int s = 0; s < steps; ++s) {
      m.fill(world_rank() + s);
      if (marks)
        for (std::size_t k = m.g.size(); k-- > 0;) sync.mark_ready(m.g[k]);
      CHECK(sync.synchronize());
    }
    // The values are right too (the timeline changes nothing): sum over ranks / ranks.
    const auto h = gradsync_test::host_copy(m.g[2]);
    double want = 0;
    for (int r = 0; r < world_size(); ++r) want += double(r + steps - 1 + 1) * 3.0 + double(5 % 7);
    want /= world_size();
    GRADSYNC_CHECK_ALL(gradsync_test::rel_err(h(5), want) < 1e-12);
    bytes = sync.stats().bytes_allreduced;
    calls = sync.stats().allreduce_calls;
  }  // the destructor writes the trace
  const std::string path = rank_file(base);
  CAPTURE(path);
  GRADSYNC_CHECK_ALL(exists(path));
  Json doc;
  std::string why;
  const bool ok = well_formed(read_file(path), doc, why);
  CAPTURE(why);
  GRADSYNC_CHECK_ALL(ok);
  if (!all_ranks(ok)) return;

  // Reduction spans: their bytes sum to the stats, one per allreduce call, names as registered.
  std::uint64_t sum = 0;
  std::set<std::string> seen;
  const auto reds = named(doc, "allreduce");
  for (const Json* e : reds) {
    const Json& a = *e->get("args");
    sum += std::uint64_t(a.get("bytes")->num);
    for (const std::string& n : split_names(a.get("tensors")->str)) seen.insert(n);
    CHECK(a.get("algorithm")->str == gradsync::to_string(gradsync::Algorithm::flat));
    CHECK(e->get("tid")->num >= 10);
  }
  GRADSYNC_CHECK_ALL(sum == bytes);
  GRADSYNC_CHECK_ALL(reds.size() == calls);
  const std::set<std::string> registered(m.names.begin(), m.names.end());
  GRADSYNC_CHECK_ALL(seen == registered);  // every data-parallel name, no local one
  GRADSYNC_CHECK_ALL(named(doc, "synchronize").size() == std::size_t(steps));
  GRADSYNC_CHECK_ALL(named(doc, "plan build").size() >= 1);
  GRADSYNC_CHECK_ALL(named(doc, "consistency check").size() >= 1);
  GRADSYNC_CHECK_ALL(named(doc, "local scaling").size() == std::size_t(world_size() > 1 ? steps : 0));
  // Process and lane names for the viewers.
  bool process_named = false;
  for (const Json* e : named(doc, "process_name"))
    process_named |= e->get("args")->get("name")->str == "rank " + std::to_string(world_rank());
  GRADSYNC_CHECK_ALL(process_named);
  const auto mark_events = named(doc, "mark_ready");
  if (marks) {
    std::multiset<std::string> marked;
    for (const Json* e : mark_events) marked.insert(e->get("args")->get("tensor")->str);
    std::multiset<std::string> want;
    for (int s = 0; s < steps; ++s) want.insert(m.names.begin(), m.names.end());
    GRADSYNC_CHECK_ALL(marked == want);
  } else {
    GRADSYNC_CHECK_ALL(mark_events.empty());
  }
  std::remove(path.c_str());
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) ::rmdir(dir.c_str());
}

}  // namespace

TEST_CASE("the per-rank path inserts .rank<r> before the extension") {
  using gradsync::impl::timeline_path;
  CHECK(timeline_path("/x/t.json", 1, 4) == "/x/t.rank1.json");
  CHECK(timeline_path("/x/t.json", 0, 1) == "/x/t.json");
  CHECK(timeline_path("/x.d/trace", 2, 3) == "/x.d/trace.rank2");
  CHECK(timeline_path(".trace", 0, 2) == ".trace.rank0");
}

TEST_CASE("the reader rejects malformed JSON") {
  for (const char* bad : {"{\"a\":[1,2}", "{\"a\":1,}", "[1 2]", "{\"a\":\"x\ny\"}", "{\"a\":1} x", "{"})
    CHECK_THROWS(parse(bad));
  CHECK(parse("{\"a\":[1,-2.5e3,true,null,\"q\\\"\"]}").get("a")->items.size() == 5);
}

TEST_CASE("a timeline of nonblocking steps") {
  gradsync::Options o = base_opts();
  o.tuning.fusion_threshold_bytes = 4096;  // several chunks, some in flight together
  o.tuning.max_chunks_in_flight = 2;
  check_run(o, false, 3);
}

TEST_CASE("a timeline of blocking steps") {
  gradsync::Options o = base_opts();
  o.tuning.collectives = gradsync::Collectives::blocking;
  o.tuning.fusion_threshold_bytes = 4096;
  check_run(o, false, 2);
}

TEST_CASE("a timeline with mark_ready") {
  gradsync::Options o = base_opts();
  o.tuning.collectives = gradsync::Collectives::nonblocking;
  o.tuning.fusion_threshold_bytes = 4096;
  check_run(o, true, 3);
}

TEST_CASE("GRADSYNC_TIMELINE turns it on; without it nothing is written") {
  const std::string dir = temp_dir();
  const std::string base = dir + "/env.json";
  Model m(world_rank());
  {
    gradsync::Options o;
    o.tuning.read_environment = true;  // GRADSYNC_TIMELINE unset (ctest sets nothing)
    REQUIRE(std::getenv("GRADSYNC_TIMELINE") == nullptr);
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    m.add_to(sync);
    CHECK(sync.synchronize());
  }
  MPI_Barrier(MPI_COMM_WORLD);
  std::string left;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* f = ::readdir(d))
      if (std::string(f->d_name) != "." && std::string(f->d_name) != "..") left += std::string(f->d_name) + " ";
    ::closedir(d);
  }
  CAPTURE(left);
  GRADSYNC_CHECK_ALL(left.empty());  // nothing written
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) ::rmdir(dir.c_str());
  const std::string dir2 = temp_dir();
  const std::string base2 = dir2 + "/env.json";
  ::setenv("GRADSYNC_TIMELINE", base2.c_str(), 1);
  {
    gradsync::Options o;
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    m.add_to(sync);
    CHECK(sync.synchronize());
    CHECK(std::string(sync.options().tuning.timeline) == base2);
    CHECK(sync.options().tuning.timeline != std::getenv("GRADSYNC_TIMELINE"));  // a copy of its own
  }
  ::unsetenv("GRADSYNC_TIMELINE");
  Json doc;
  std::string why;
  const std::string path = rank_file(base2);
  GRADSYNC_CHECK_ALL(well_formed(read_file(path), doc, why));
  GRADSYNC_CHECK_ALL(named(doc, "synchronize").size() == 1);
  std::remove(path.c_str());
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) ::rmdir(dir2.c_str());
}

TEST_CASE("two live syncs with one path write two files; .sync2 is the second's") {
  const std::string dir = temp_dir();
  const std::string base = dir + "/two.json", second = dir + "/two.sync2.json";
  gradsync::Options o = base_opts();
  o.tuning.timeline = base.c_str();
  View a("a", 10), b("b", 20);
  {
    Sync s1(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    Sync s2(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    s1.add<Dense>(a, "a");
    s2.add<Dense>(b, "b");
    CHECK(s1.synchronize());
    CHECK(s2.synchronize());
    CHECK(s2.synchronize());
  }
  // Not a structured binding: CAPTURE's lambda would capture one, which is C++20 (nvcc warns).
  for (const auto& row : {std::tuple(base, "a", 1), std::tuple(second, "b", 2)}) {
    const std::string path = std::get<0>(row), tensor = std::get<1>(row);
    const int calls = std::get<2>(row);
    Json doc;
    std::string why;
    CAPTURE(path);
    GRADSYNC_CHECK_ALL(well_formed(read_file(rank_file(path)), doc, why));
    const auto reds = named(doc, "allreduce");
    GRADSYNC_CHECK_ALL(reds.size() == std::size_t(calls) && reds[0]->get("args")->get("tensors")->str == tensor);
    std::remove(rank_file(path).c_str());
  }
  {  // both gone: the next one writes the path itself again
    Sync s3(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  }
  GRADSYNC_CHECK_ALL(exists(rank_file(base)) && !exists(rank_file(second)));
  std::remove(rank_file(base).c_str());
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) ::rmdir(dir.c_str());
}

TEST_CASE("a path that cannot be written is a ConfigError naming it") {
  gradsync::Options o = base_opts();
  o.tuning.timeline = "/nonexistent-gradsync-dir/t.json";
  bool thrown = false;
  std::string what;
  try {
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  } catch (const gradsync::ConfigError& e) {
    thrown = true;
    what = e.what();
  }
  CAPTURE(what);
  GRADSYNC_CHECK_ALL(thrown && has(what, "/nonexistent-gradsync-dir/t") && has(what, "GRADSYNC_TIMELINE"));
}

TEST_CASE("a stall's trace holds the warning, the missing rank and the error") {
  GRADSYNC_SKIP_BELOW_RANKS(2, "a stall needs a peer that waits for the missing rank");
  const int rank = world_rank(), victim = world_size() - 1;
  const std::string dir = temp_dir();
  const std::string base = dir + "/stall.json";
  gradsync::Options o = base_opts();
  o.tuning.timeline = base.c_str();
  o.op = gradsync::ReduceOp::sum;
  o.stall_timeout = 1.0;
  o.tuning.stall_warning = 0.4;
  View g("g", 64);
  bool stalled = false;
  {
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    sync.add<Dense>(g, "g");
    try {
      for (int step = 0; step < 3; ++step) {
        if (rank == victim && step == 1) continue;  // skips one call: the others wait for it
        (void)sync.synchronize();
      }
      // Its sync alive past the others' deadline: one that ended would tell them at once.
      if (rank == victim)
        std::this_thread::sleep_for(std::chrono::duration<double>(o.stall_timeout * gradsync_test::kStallPromiseFactor +
                                                                  2 * gradsync_test::kSchedulingSlack_s));
    } catch (const gradsync::StallError&) {
      stalled = true;
    }
  }
  const std::string path = rank_file(base);
  Json doc;
  std::string why;
  const bool ok = well_formed(read_file(path), doc, why);
  CAPTURE(why);
  GRADSYNC_CHECK_ALL(ok);
  if (rank != victim) {
    CHECK(stalled);
    const auto warnings = named(doc, "stall warning");
    REQUIRE(warnings.size() >= 1);
    const std::string missing = "[" + std::to_string(victim) + "]";
    CHECK(warnings[0]->get("args")->get("missing_ranks")->str == missing);
    CHECK(has(warnings[0]->get("args")->get("report")->str, "missing ranks: " + missing));
    const auto errors = named(doc, "StallError");
    REQUIRE(errors.size() == 1);
    CHECK(errors[0]->get("args")->get("missing_ranks")->str == missing);
  }
  std::remove(path.c_str());
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) ::rmdir(dir.c_str());
}

// stall_action = abort: the trace is written before MPI_Abort. The first test case runs in a job
// that aborts (ctest timeline_abort, 2 ranks); the second (timeline_abort_check) reads its files.
#ifdef GRADSYNC_TIMELINE_ABORT_DIR
TEST_CASE("timeline before an abort" * doctest::skip()) {
  const int rank = world_rank(), victim = world_size() - 1;
  ::mkdir(GRADSYNC_TIMELINE_ABORT_DIR, 0755);
  MPI_Barrier(MPI_COMM_WORLD);
  gradsync::Options o = base_opts();
  o.tuning.timeline = GRADSYNC_TIMELINE_ABORT_DIR "/trace.json";
  o.stall_timeout = 1.0;
  o.tuning.stall_warning = 0.4;
  o.tuning.stall_action = gradsync::StallAction::abort;
  View g("g", 16);
  Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
  sync.add<Dense>(g, "g");
  CHECK(sync.synchronize());
  if (rank == victim) std::this_thread::sleep_for(std::chrono::seconds(60));  // killed by the abort
  (void)sync.synchronize();
  FAIL("the job should have been aborted");
}

TEST_CASE("the trace of an aborted job" * doctest::skip()) {
  // Rank 0 of the 2-rank job above waited for rank 1, warned, and aborted: its file is complete.
  Json doc;
  std::string why;
  const bool ok = well_formed_as(read_file(GRADSYNC_TIMELINE_ABORT_DIR "/trace.rank0.json"), doc, why, 0);
  CAPTURE(why);
  REQUIRE(ok);
  REQUIRE(named(doc, "stall warning").size() == 1);
  const auto errors = named(doc, "StallError");
  REQUIRE(errors.size() == 1);
  CHECK(errors[0]->get("args")->get("missing_ranks")->str == "[1]");
  CHECK(named(doc, "synchronize").size() == 1);  // the first call; the second threw
  CHECK(named(doc, "allreduce").size() == 1);
}
#endif

TEST_CASE("compressed chunks: their spans start at their launch and count wire bytes") {
  const std::string dir = temp_dir();
  const std::string base = dir + "/bf16.json";
  gradsync::Options o = base_opts();
  o.tuning.timeline = base.c_str();
  o.compression = gradsync::Compression::bf16;
  o.tuning.fusion_threshold_bytes = 4096;
  Model m(world_rank());
  std::uint64_t bytes = 0;
  {
    Sync sync(gradsync::MpiBackend(MPI_COMM_WORLD), o);
    m.add_to(sync);
    CHECK(sync.synchronize());
    CHECK(sync.synchronize());
    bytes = sync.stats().bytes_allreduced;
    GRADSYNC_CHECK_ALL(bytes < sync.stats().bytes_uncompressed);  // the wire format was used
  }
  Json doc;
  std::string why;
  GRADSYNC_CHECK_ALL(well_formed(read_file(rank_file(base)), doc, why));
  const double first = named(doc, "plan build")[0]->get("ts")->num;
  std::uint64_t sum = 0;
  bool after_plan = true;
  for (const Json* e : named(doc, "allreduce")) {
    sum += std::uint64_t(e->get("args")->get("bytes")->num);
    after_plan = after_plan && e->get("ts")->num >= first;
  }
  GRADSYNC_CHECK_ALL(sum == bytes);
  GRADSYNC_CHECK_ALL(after_plan);
  std::remove(rank_file(base).c_str());
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) ::rmdir(dir.c_str());
}
