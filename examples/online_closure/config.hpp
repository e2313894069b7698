// online_closure: the run's parameters and the command line.
#pragma once

#include "../common/example_common.hpp"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace closure {

constexpr double pi = 3.14159265358979323846;

struct Config {
  // The problem.
  int cells = 128;    // coarse cells on [0, 2 pi)
  int refine = 8;     // fine cells per coarse cell
  int substeps = 16;  // fine steps per coarse step
  double nu = 0.02;   // viscosity (both grids)
  double dt = 0.01;   // coarse time step
  // The closure and its training.
  int hidden = 16;   // trunk width
  int passes = 4;    // backward_passes_per_step: solver steps per optimizer step
  double lr = 1e-2;  // Adam, cosine-decayed to lr / 100
  std::uint64_t seed = 1;
  int steps = 3000;  // solver steps (one backward pass each)
  bool steps_given = false;
  int rollout = 25;       // steps of each free-running evaluation window (0: none)
  int eval_windows = 20;  // free-running windows after training, the closure frozen
  int log_every = 250;
  bool check = false;
  bool scale_local = true;  // --local-scale world_size (default) | none
  // --select-steep F: train on the cells where the coarse state is steep, |du/dx| >= F times its
  // global max (every rank's own mean loss, weighted by set_samples()); < 0: every cell.
  double select_steep = -1;
  bool sample_weights = true;  // --sample-weights off: no set_samples(), the plain average (wrong)
  double max_ratio = -1;       // --max-ratio F: exit 1 unless the final one-step error ratio <= F
  std::string plot;            // --plot FILE.png
  int schedule = 0;            // --schedule S: solver steps the learning rate decays over (0: --steps)
  std::string save_path;       // --save PATH: a checkpoint after training
  std::string load_path;       // --load PATH: continue from a checkpoint
  bool digest = false;         // --digest: the sum of squares of every parameter
  bool shard = false;          // --shard: Adam's state sharded over the ranks (Options::shard)

  double fine_dt() const { return dt / substeps; }
  bool selecting() const { return select_steep >= 0; }
};

inline void usage(const char* argv0) {
  std::printf(
      "usage: mpirun -np N %s [options]\n"
      "  --cells N          coarse cells of the periodic domain [0, 2 pi) (default 128)\n"
      "  --refine R         fine cells per coarse cell (default 8)\n"
      "  --substeps S       fine steps per coarse step (default 16)\n"
      "  --nu X             viscosity (default 0.02)\n"
      "  --dt X             coarse time step (default 0.01)\n"
      "  --hidden H         width of the data-parallel trunk (default 16)\n"
      "  --passes N         backward passes (solver steps) per optimizer step (default 4)\n"
      "  --lr X             Adam learning rate (default 1e-2, cosine-decayed to lr / 100)\n"
      "  --steps S          solver steps (default 3000; %s with --check)\n"
      "  --schedule S       solver steps the learning rate decays over (default: --steps)\n"
      "  --save PATH        after training, write a checkpoint (parallel HDF5): parameters, Adam state,\n"
      "                     the schedule, the solver's time step and fine field\n"
      "  --load PATH        continue from a checkpoint (the same rank count), --steps more solver steps\n"
      "  --digest           rank 0 prints 'parameters digest: X', the sum of squares of every parameter\n"
      "  --shard            shard the trunk's Adam state over the ranks (docs/SHARDING.md); the heads keep\n"
      "                     theirs whole\n"
      "  --rollout K        steps of each free-running evaluation window, 0 for none (default 25)\n"
      "  --eval-windows W   free-running windows after training, the closure frozen (default 20)\n"
      "  --log-every N      progress line every N steps (default 250)\n"
      "  --seed S           seed of the initial model (default 1)\n"
      "  --check            prove n ranks == 1 process on the same global problem (exit 1 if not)\n"
      "  --local-scale M    world_size (default) or none: the LocalScale of the per-subdomain heads\n"
      "  --select-steep F   train only on the cells where |du/dx| of the coarse state is >= F times its\n"
      "                     max over the domain (0 <= F <= 1): a sample count per rank and pass, set_samples()\n"
      "  --sample-weights M on (default) or off: with --select-steep, off drops set_samples() (each rank's\n"
      "                     mean loss, plain average: the check fails)\n"
      "  --max-ratio F      exit 1 unless the last window's corrected/plain one-step error is <= F\n"
      "  --plot FILE.png    write FILE.csv files and plot them with python3 and matplotlib\n",
      argv0, "3 optimizer steps");
}

inline void validate(const Config& c) {
  auto fail = [](const std::string& m) { throw std::runtime_error(m); };
  if (c.cells < 4) fail("--cells must be >= 4");
  if (c.refine < 1) fail("--refine must be >= 1");
  if (c.substeps < 1) fail("--substeps must be >= 1");
  if (!(c.nu >= 0)) fail("--nu must be >= 0");
  if (!(c.dt > 0)) fail("--dt must be > 0");
  if (c.hidden < 1) fail("--hidden must be >= 1");
  if (c.passes < 1) fail("--passes must be >= 1");
  if (c.steps < 0) fail("--steps must be >= 0");
  if (c.rollout < 0) fail("--rollout must be >= 0");
  if (c.eval_windows < 0) fail("--eval-windows must be >= 0");
  if (c.log_every < 1) fail("--log-every must be >= 1");
  if (c.select_steep != -1 && !(c.select_steep >= 0 && c.select_steep <= 1))
    fail("--select-steep takes a fraction of the steepest cell's |du/dx|, 0 to 1");
  if (!c.sample_weights && !c.selecting()) fail("--sample-weights off needs --select-steep");
  if (c.selecting() && !c.scale_local)
    fail(
        "--select-steep with --local-scale none: the heads' weights are the sample counts' (set_samples needs "
        "LocalScale::world_size)");
  if (!c.plot.empty() && (c.rollout < 1 || c.eval_windows < 1))
    fail("--plot draws the end of a free-running window: it needs --rollout and --eval-windows >= 1");
  // Forward Euler on the diffusion term is stable for nu dt / dx^2 <= 1/2 (less with advection).
  const double dx_f = 2 * pi / (double(c.cells) * c.refine), dx_c = 2 * pi / c.cells;
  if (c.nu * c.fine_dt() / (dx_f * dx_f) > 0.4 || c.nu * c.dt / (dx_c * dx_c) > 0.4)
    fail(
        "the time step is unstable for the viscosity: nu dt / dx^2 must stay <= 0.4 on both grids "
        "(raise --substeps or lower --dt)");
}

inline bool parse_on_off(const std::string& option, const std::string& m) {
  if (m == "on") return true;
  if (m == "off") return false;
  throw std::runtime_error(option + " takes on or off, not " + m);
}

/// Parses the command line, skipping Kokkos' --kokkos-* options; false for --help (after printing
/// the usage when `print`).
inline bool parse(Config& c, int argc, char** argv, bool print) {
  const bool run = examples::parse_args(argc, argv, print, usage, [&](const std::string& o, auto&& value) {
    if (o == "--cells")
      c.cells = std::stoi(value());
    else if (o == "--refine")
      c.refine = std::stoi(value());
    else if (o == "--substeps")
      c.substeps = std::stoi(value());
    else if (o == "--nu")
      c.nu = std::stod(value());
    else if (o == "--dt")
      c.dt = std::stod(value());
    else if (o == "--hidden")
      c.hidden = std::stoi(value());
    else if (o == "--passes")
      c.passes = std::stoi(value());
    else if (o == "--lr")
      c.lr = std::stod(value());
    else if (o == "--steps")
      c.steps = std::stoi(value()), c.steps_given = true;
    else if (o == "--schedule")
      c.schedule = std::stoi(value());
    else if (o == "--save")
      c.save_path = value();
    else if (o == "--load")
      c.load_path = value();
    else if (o == "--digest")
      c.digest = true;
    else if (o == "--shard")
      c.shard = true;
    else if (o == "--rollout")
      c.rollout = std::stoi(value());
    else if (o == "--eval-windows")
      c.eval_windows = std::stoi(value());
    else if (o == "--log-every")
      c.log_every = std::stoi(value());
    else if (o == "--seed")
      c.seed = std::stoull(value());
    else if (o == "--check")
      c.check = true;
    else if (o == "--local-scale")
      c.scale_local = examples::parse_scale(o, value());
    else if (o == "--select-steep")
      c.select_steep = std::stod(value());
    else if (o == "--sample-weights")
      c.sample_weights = parse_on_off(o, value());
    else if (o == "--max-ratio")
      c.max_ratio = std::stod(value());
    else if (o == "--plot")
      c.plot = value();
    else
      return false;
    return true;
  });
  if (!run) return false;
  if (c.check && !c.steps_given) c.steps = 3 * c.passes;
  validate(c);
  return true;
}

}  // namespace closure
