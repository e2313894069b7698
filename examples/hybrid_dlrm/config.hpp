// hybrid_dlrm: the model configuration and the command line.
//
// The defaults are the published DLRM configuration for the Criteo Kaggle data set
// (data/models/dlrm_criteo_kaggle.json in the repository): 26 tables of dimension 16, bottom MLP
// 13-512-256-64-16, dot interaction, top MLP 367-512-256-1. `--config FILE` reads such a JSON file.
#pragma once

#include "../common/example_common.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace dlrm {

struct Config {
  // Model (rows before the cap).
  std::vector<std::int64_t> table_rows = {1460,  583,  10131227, 2202608, 305, 24,     12517,   633,   3,
                                          93145, 5683, 8351593,  3194,    27,  14992,  5461306, 10,    5652,
                                          2173,  4,    7046547,  18,      15,  286181, 105,     142572};
  int dim = 16;
  std::vector<int> bottom = {13, 512, 256, 64, 16};
  std::vector<int> top = {367, 512, 256, 1};

  // Run.
  std::int64_t row_cap = 100000;  // rows per table at most, so the model fits a small machine
  int batch = 128;                // global batch (all ranks together)
  int steps = 100;
  bool steps_given = false;
  double lr = 0.1;
  std::uint64_t seed = 1;  // model initialisation and data stream; the teacher's seed is fixed
  int log_every = 10;
  bool check = false;
  bool scale_tables = true;          // --table-scale world_size (default) | none
  int replicas = 0;                  // --replicas R: tables sharded over n/R ranks, replicated R times (0: off)
  double min_loss_drop = -1;         // --min-loss-drop F: fail unless the loss fell by the fraction F
  double clip = 0;                   // --clip MAX: gradients clipped to global norm MAX before each step (0: off)
  std::string compression = "none";  // --compression none | fp16 | bf16: the MLP gradients on the wire
  bool uneven = false;               // --uneven: rank p holds a share of the batch proportional to p
  bool weights = true;               // --weights on | off: with --uneven, set_samples() (off: plain average)
  std::string save_path;             // --save PATH: a checkpoint at the end of the run
  std::string load_path;             // --load PATH: continue from a checkpoint (its step onwards)
  bool digest = false;               // --digest: print the sum of squares of every parameter
  bool shard = false;                // --shard: the MLP step sharded (Options::shard, docs/SHARDING.md)

  int num_tables() const { return int(table_rows.size()); }
  int dense_features() const { return bottom.front(); }
  std::int64_t rows(int t) const { return std::min(table_rows[std::size_t(t)], row_cap); }
  // Dot interaction over the bottom output and the 26 embeddings: 27 vectors, 27*26/2 pairs, plus
  // the bottom output itself.
  int num_vectors() const { return num_tables() + 1; }
  int num_pairs() const { return num_vectors() * (num_vectors() - 1) / 2; }
  int interaction_width() const { return dim + num_pairs(); }
};

inline void usage(const char* argv0) {
  std::printf(
      "usage: mpirun -np N %s [options]\n"
      "  --batch B          global batch size, split over the ranks (default 128)\n"
      "  --steps S          SGD steps (default 100; 3 with --check)\n"
      "  --lr X             learning rate (default 0.1)\n"
      "  --rows R           row cap per embedding table (default 100000)\n"
      "  --seed S           seed of the initial model and the data stream (default 1)\n"
      "  --log-every N      progress line every N steps (default 10)\n"
      "  --check            prove n ranks == 1 process on the same global batches (exit 1 if not)\n"
      "  --table-scale M    world_size (default) or none: the LocalScale of the table group\n"
      "  --replicas R       2-D: tables sharded within groups of n/R ranks, replicated over the R groups\n"
      "                     (their gradients summed over each shard's replicas, a gradsync process set)\n"
      "  --clip MAX         clip the gradients by the whole model's norm (gradsync::clip_grad_norm) to MAX\n"
      "                     before each step (default 0: off)\n"
      "  --min-loss-drop F  exit 1 unless the held-out loss fell by the fraction F\n"
      "  --compression C    none (default), fp16 or bf16: the MLP gradients' format on the wire\n"
      "  --uneven           rank p holds a share of each batch proportional to p (rank 0 none); each rank\n"
      "                     differentiates its own mean loss and gives its count to set_samples()\n"
      "  --weights W        on (default) or off: with --uneven, off drops set_samples() (a plain average:\n"
      "                     what --check then shows is wrong)\n"
      "  --save PATH        write a checkpoint (parallel HDF5) at the end of the run\n"
      "  --load PATH        continue from a checkpoint: its parameters, then --steps more steps from its step\n"
      "                     (any rank count: each table goes to whichever rank holds it now)\n"
      "  --digest           rank 0 prints 'parameters digest: X', the sum of squares of every parameter of\n"
      "                     the global model (tables once), 17 significant digits\n"
      "  --shard            the MLPs' step sharded (docs/SHARDING.md): their gradients reduce-scattered, each\n"
      "                     rank updates its slices, the parameters allgathered (gradsync::allgather_parameters)\n"
      "  --bottom-mlp L     e.g. 13-512-256-64-16 (first = 13 dense features, last = dim)\n"
      "  --top-mlp L        e.g. 367-512-256-1 (first = interaction width, last = 1)\n"
      "  --config FILE      read table_rows, embedding_dim, bottom_mlp, top_mlp from a DLRM JSON\n",
      argv0);
}

namespace impl {

template <class T>
std::vector<T> parse_dash_list(const std::string& s) {
  std::vector<T> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, '-')) v.push_back(T(std::stoll(item)));
  return v;
}

// The numbers after "key": in a JSON text, a scalar or a flat array. Enough for the DLRM configs.
inline std::vector<std::int64_t> json_numbers(const std::string& text, const std::string& key) {
  const std::size_t k = text.find("\"" + key + "\"");
  if (k == std::string::npos) throw std::runtime_error("config: no key \"" + key + "\"");
  std::size_t p = text.find(':', k);
  std::vector<std::int64_t> v;
  const bool array = text.find_first_not_of(" \t\r\n", p + 1) != std::string::npos &&
                     text[text.find_first_not_of(" \t\r\n", p + 1)] == '[';
  const std::size_t end = array ? text.find(']', p) : text.find_first_of(",}", p);
  std::string body = text.substr(p + 1, end - p - 1);
  for (char& c : body)
    if (c == '[' || c == ',' || c == '\n' || c == '\r' || c == '\t') c = ' ';
  std::stringstream ss(body);
  std::int64_t x;
  while (ss >> x) v.push_back(x);
  if (v.empty()) throw std::runtime_error("config: no numbers for \"" + key + "\"");
  return v;
}

}  // namespace impl

inline void read_json(Config& c, const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  c.table_rows = impl::json_numbers(text, "table_rows");
  c.dim = int(impl::json_numbers(text, "embedding_dim").at(0));
  c.bottom.clear();
  c.top.clear();
  for (auto x : impl::json_numbers(text, "bottom_mlp")) c.bottom.push_back(int(x));
  for (auto x : impl::json_numbers(text, "top_mlp")) c.top.push_back(int(x));
}

inline void validate(const Config& c) {
  auto fail = [](const std::string& m) { throw std::runtime_error(m); };
  if (c.table_rows.empty()) fail("no embedding tables");
  if (c.dim < 1) fail("embedding dimension must be >= 1");
  if (c.bottom.size() < 2 || c.bottom.back() != c.dim)
    fail("the bottom MLP must end at the embedding dimension " + std::to_string(c.dim));
  if (c.top.size() < 2 || c.top.front() != c.interaction_width() || c.top.back() != 1)
    fail("the top MLP must go from the interaction width " + std::to_string(c.interaction_width()) + " to 1");
  for (int w : c.bottom)
    if (w < 1) fail("MLP widths must be >= 1");
  for (int w : c.top)
    if (w < 1) fail("MLP widths must be >= 1");
  if (c.row_cap < 1) fail("--rows must be >= 1");
  if (c.batch < 1) fail("--batch must be >= 1");
  if (c.steps < 0) fail("--steps must be >= 0");
  if (c.log_every < 1) fail("--log-every must be >= 1");
  if (c.replicas < 0) fail("--replicas must be >= 1");
  if (c.replicas > 0 && !c.scale_tables) fail("--replicas takes the default --table-scale world_size");
  if (c.uneven && !c.scale_tables) fail("--uneven takes the default --table-scale world_size");
  if (!c.weights && !c.uneven) fail("--weights off goes with --uneven");
  if (!(c.clip >= 0)) fail("--clip must be >= 0");
  if (c.check && (!c.save_path.empty() || !c.load_path.empty()))
    fail("--save and --load go with training runs, not --check");
}

/// Parses the command line, skipping Kokkos' --kokkos-* options; returns false for --help (after
/// printing the usage when `print`).
inline bool parse(Config& c, int argc, char** argv, bool print = true) {
  std::string bottom, top;
  const bool run = examples::parse_args(argc, argv, print, usage, [&](const std::string& o, auto&& value) {
    if (o == "--batch")
      c.batch = std::stoi(value());
    else if (o == "--steps")
      c.steps = std::stoi(value()), c.steps_given = true;
    else if (o == "--lr")
      c.lr = std::stod(value());
    else if (o == "--rows")
      c.row_cap = std::stoll(value());
    else if (o == "--seed")
      c.seed = std::stoull(value());
    else if (o == "--log-every")
      c.log_every = std::stoi(value());
    else if (o == "--check")
      c.check = true;
    else if (o == "--table-scale")
      c.scale_tables = examples::parse_scale(o, value());
    else if (o == "--replicas") {
      c.replicas = std::stoi(value());
    } else if (o == "--compression") {
      c.compression = value();
      if (c.compression != "none" && c.compression != "fp16" && c.compression != "bf16")
        throw std::runtime_error("--compression takes none, fp16 or bf16, not " + c.compression);
    } else if (o == "--uneven") {
      c.uneven = true;
    } else if (o == "--weights") {
      const std::string w = value();
      if (w != "on" && w != "off") throw std::runtime_error("--weights takes on or off, not " + w);
      c.weights = w == "on";
    } else if (o == "--save") {
      c.save_path = value();
    } else if (o == "--load") {
      c.load_path = value();
    } else if (o == "--digest") {
      c.digest = true;
    } else if (o == "--shard") {
      c.shard = true;
    } else if (o == "--clip")
      c.clip = std::stod(value());
    else if (o == "--min-loss-drop")
      c.min_loss_drop = std::stod(value());
    else if (o == "--bottom-mlp")
      bottom = value();
    else if (o == "--top-mlp")
      top = value();
    else if (o == "--config")
      read_json(c, value());
    else
      return false;
    return true;
  });
  if (!run) return false;
  if (!bottom.empty()) c.bottom = impl::parse_dash_list<int>(bottom);
  if (!top.empty()) c.top = impl::parse_dash_list<int>(top);
  if (c.check && !c.steps_given) c.steps = 3;
  validate(c);
  return true;
}

}  // namespace dlrm
