// gradsync benchmarks: models, timing and output shared by the benchmark programs.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace bench {

inline int rank(MPI_Comm c = MPI_COMM_WORLD) {
  int r = 0;
  MPI_Comm_rank(c, &r);
  return r;
}
inline int size(MPI_Comm c = MPI_COMM_WORLD) {
  int n = 1;
  MPI_Comm_size(c, &n);
  return n;
}

/// A model's gradient list: element counts in registration (forward) order; `local` marks
/// tensors that stay on their rank (DLRM's embedding tables).
struct Model {
  std::string name;
  std::vector<std::size_t> numel;
  std::vector<bool> local;
  std::size_t row_width = 0;  // DLRM: local tensors are tables of rows this wide, synced as RowSparse
  std::size_t dp_elements() const {
    std::size_t n = 0;
    for (std::size_t i = 0; i < numel.size(); ++i)
      if (!local[i]) n += numel[i];
    return n;
  }
  std::size_t dp_tensors() const { return std::size_t(std::count(local.begin(), local.end(), false)); }
};

/// The torchvision CSV lists: name,shape,numel.
inline Model read_csv_model(const std::string& path, const std::string& name) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  Model m;
  m.name = name;
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto pos = line.rfind(',');
    m.numel.push_back(std::stoull(line.substr(pos + 1)));
    m.local.push_back(false);
  }
  return m;
}

// Integers of the JSON array after "key": the DLRM file is flat and regular.
inline std::vector<std::size_t> json_ints(const std::string& text, const std::string& key) {
  const auto k = text.find("\"" + key + "\"");
  if (k == std::string::npos) throw std::runtime_error("DLRM json: no key " + key);
  const auto b = text.find('[', k), e = text.find(']', b);
  std::vector<std::size_t> v;
  std::stringstream ss(text.substr(b + 1, e - b - 1));
  std::string tok;
  while (std::getline(ss, tok, ',')) v.push_back(std::stoull(tok));
  return v;
}
inline std::size_t json_int(const std::string& text, const std::string& key) {
  const auto k = text.find("\"" + key + "\"");
  if (k == std::string::npos) throw std::runtime_error("DLRM json: no key " + key);
  return std::stoull(text.substr(text.find(':', k) + 1));
}

/// DLRM: the MLP layers (weights then biases, bottom then top) are data-parallel; each rank keeps
/// the embedding tables it owns (table t on rank t % n), rows capped at `row_cap` to fit here.
inline Model read_dlrm_model(const std::string& path, std::size_t row_cap, std::size_t* mlp_elements) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string t = ss.str();
  const std::size_t dim = json_int(t, "embedding_dim");
  Model m;
  m.row_width = dim;
  m.name = "DLRM (MLP)";
  std::size_t mlp = 0;
  for (const char* key : {"bottom_mlp", "top_mlp"}) {
    const auto l = json_ints(t, key);
    for (std::size_t i = 0; i + 1 < l.size(); ++i) {
      m.numel.push_back(l[i] * l[i + 1]);
      m.numel.push_back(l[i + 1]);
      m.local.push_back(false);
      m.local.push_back(false);
      mlp += l[i] * l[i + 1] + l[i + 1];
    }
  }
  const auto rows = json_ints(t, "table_rows");
  for (std::size_t j = 0; j < rows.size(); ++j)
    if (int(j % std::size_t(size())) == rank()) {
      m.numel.push_back(std::min(rows[j], row_cap) * dim);
      m.local.push_back(true);
    }
  *mlp_elements = mlp;
  return m;
}

/// One timed method: `run` does one synchronization; times are the slowest rank's, per repetition.
struct Method {
  std::string name;
  std::function<void()> run;
  std::vector<double> times;
};

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// Runs every method `reps` times, interleaved (a rotating order), so that a burst of load from
/// other processes hits them alike and same-run ratios stay meaningful.
inline void measure(std::vector<Method>& ms, int warmup, int reps, MPI_Comm comm = MPI_COMM_WORLD) {
  for (int w = 0; w < warmup; ++w)
    for (auto& m : ms) m.run();
  for (int r = 0; r < reps; ++r)
    for (std::size_t k = 0; k < ms.size(); ++k) {
      Method& m = ms[(k + std::size_t(r)) % ms.size()];
      MPI_Barrier(comm);
      const double t0 = MPI_Wtime();
      m.run();
      double dt = MPI_Wtime() - t0;
      MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, comm);
      m.times.push_back(dt);
    }
}

/// Repetitions that fit a time budget, given one estimate of a round over all methods.
inline int reps_for(double round_seconds, double budget_seconds, int lo, int hi) {
  int r = round_seconds > 0 ? int(budget_seconds / round_seconds) : hi;
  MPI_Allreduce(MPI_IN_PLACE, &r, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return std::max(lo, std::min(hi, r));
}

/// Times one round of every method to estimate its cost, then measures as many rounds (at least
/// `lo`, at most `hi`) as fit `budget_seconds`.
inline void measure_within(std::vector<Method>& ms, double budget_seconds, int lo, int hi) {
  std::vector<Method> probe = ms;
  measure(probe, 1, 1);
  double round = 0;
  for (auto& p : probe) round += p.times[0];
  measure(ms, 1, reps_for(round, budget_seconds, lo, hi));
}

}  // namespace bench
