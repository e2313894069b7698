// The test bed's own check, and its bandwidth probe (MPI only, no gradsync).
//   mh_probe where HOSTS PER_HOST IFACE   ranks really sit on HOSTS different hostnames, PER_HOST
//                                         each (MPI_Get_processor_name), and bytes between hosts
//                                         cross IFACE (TCP) while bytes within a host do not
//                                         (shared memory); exits non-zero on every rank otherwise
//   mh_probe bw PER_HOST [REPS]           ping-pong between rank 0 and rank PER_HOST (the first
//                                         rank of the other host) and MPI_Allreduce over all
//                                         ranks, 4 to 64 MiB, median GB/s of REPS (default 5)
//   mh_probe tensors CSV [REPS]           one MPI_Allreduce of float per tensor of a model list
//                                         (data/models/*.csv: name,shape,numel), median
//                                         seconds of REPS (default 5)
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

int rank_ = 0, size_ = 1;

// Bytes IFACE sent plus received, from /proc/net/dev: per network namespace, so it counts the
// caller's "host" only. -1 when the interface is absent.
long long iface_bytes(const std::string& iface) {
  std::ifstream f("/proc/net/dev");
  std::string line;
  while (std::getline(f, line)) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    name.erase(0, name.find_first_not_of(' '));
    if (name != iface) continue;
    std::istringstream in(line.substr(colon + 1));
    long long v[9] = {};
    for (auto& x : v) in >> x;
    return v[0] + v[8];  // rx bytes, tx bytes
  }
  return -1;
}

bool all(bool ok) {
  int v = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  return v != 0;
}

// `reps` round trips of `bytes` between ranks a and b; others wait. Seconds per round trip.
double pingpong(int a, int b, std::vector<char>& buf, std::size_t bytes, int reps) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  for (int i = 0; i < reps; ++i) {
    if (rank_ == a) {
      MPI_Send(buf.data(), int(bytes), MPI_BYTE, b, 0, MPI_COMM_WORLD);
      MPI_Recv(buf.data(), int(bytes), MPI_BYTE, b, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else if (rank_ == b) {
      MPI_Recv(buf.data(), int(bytes), MPI_BYTE, a, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buf.data(), int(bytes), MPI_BYTE, a, 0, MPI_COMM_WORLD);
    }
  }
  double t = (MPI_Wtime() - t0) / reps;
  MPI_Bcast(&t, 1, MPI_DOUBLE, a, MPI_COMM_WORLD);
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int where(int hosts, int per_host, const std::string& iface) {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  MPI_Get_processor_name(name, &len);
  std::vector<char> names(std::size_t(size_) * MPI_MAX_PROCESSOR_NAME);
  MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD);
  const auto name_of = [&](int r) { return std::string(&names[std::size_t(r) * MPI_MAX_PROCESSOR_NAME]); };
  bool ok = true;
  // Rank r belongs on host r / per_host (the runner maps by slot): same name within a host,
  // different names across hosts.
  for (int r = 0; r < size_ && ok; ++r)
    for (int s = 0; s < size_; ++s)
      if ((r / per_host == s / per_host) != (name_of(r) == name_of(s))) ok = false;
  if (rank_ == 0) {
    for (int r = 0; r < size_; ++r) std::printf("mh_probe: rank %d on host %s\n", r, name_of(r).c_str());
    std::printf("mh_probe: %d ranks on %d hostnames, %d per host: %s\n", size_, hosts, per_host,
                ok ? "as mapped" : "NOT as expected");
  }
  // What carries the bytes: 16 MiB each way, counted on IFACE of rank 0's host.
  const std::size_t bytes = 16u << 20;
  std::vector<char> buf(bytes, 1);
  const long long b0 = iface_bytes(iface);
  if (!all(b0 >= 0)) {
    if (rank_ == 0) std::printf("mh_probe: interface %s missing on some host\n", iface.c_str());
    return 1;
  }
  if (per_host >= 2) {
    pingpong(0, 1, buf, bytes, 1);
    long long moved = iface_bytes(iface) - b0;
    MPI_Bcast(&moved, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);  // counted on host 0, where both ran
    const bool shm = moved < (1 << 20);                      // a few heartbeats at most, not 32 MiB
    if (rank_ == 0)
      std::printf("mh_probe: 32 MiB between ranks 0 and 1 (same host): %lld bytes on %s: %s\n", moved, iface.c_str(),
                  shm ? "shared memory" : "NOT shared memory");
    ok = ok && shm;
  }
  const long long b1 = iface_bytes(iface);
  pingpong(0, per_host, buf, bytes, 1);
  long long moved = iface_bytes(iface) - b1;
  MPI_Bcast(&moved, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);  // host 0's veth (other hosts' may not carry it)
  const bool tcp = moved >= 2 * (long long)bytes;          // both directions, plus TCP/IP headers
  if (rank_ == 0)
    std::printf("mh_probe: 32 MiB between ranks 0 and %d (other host): %lld bytes on %s: %s\n", per_host, moved,
                iface.c_str(), tcp ? "TCP over the veth" : "NOT over the veth");
  ok = all(ok && tcp);
  if (rank_ == 0) std::printf("mh_probe: %s\n", ok ? "multi-host test bed OK" : "multi-host test bed FAILED");
  return ok ? 0 : 1;
}

int bw(int per_host, int reps) {
  for (std::size_t mib : {4, 16, 64}) {
    const std::size_t bytes = mib << 20;
    std::vector<char> buf(bytes, 1);
    std::vector<float> x(bytes / sizeof(float), 1.0f);
    std::vector<double> pp, ar;
    pingpong(0, per_host, buf, bytes, 1);  // warm up: connections, registration
    MPI_Allreduce(MPI_IN_PLACE, x.data(), int(x.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    for (int i = 0; i < reps; ++i) {
      pp.push_back(pingpong(0, per_host, buf, bytes, 1));
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, x.data(), int(x.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double t = MPI_Wtime() - t0;
      MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      ar.push_back(t);
    }
    // Ping-pong: 2 x bytes per round trip. Allreduce: bytes / time (the "algorithm bandwidth").
    if (rank_ == 0)
      std::printf("mh_probe bw: %3zu MiB  ping-pong %.3f GB/s  allreduce %.3f GB/s (%.1f ms)  [median of %d]\n", mib,
                  2.0 * double(bytes) / median(pp) / 1e9, double(bytes) / median(ar) / 1e9, median(ar) * 1e3, reps);
  }
  return 0;
}

int tensors(const char* csv, int reps) {
  std::vector<std::size_t> numel;
  std::ifstream f(csv);
  std::string line;
  std::getline(f, line);  // header
  while (std::getline(f, line)) {
    const auto comma = line.rfind(',');
    if (comma != std::string::npos) numel.push_back(std::stoul(line.substr(comma + 1)));
  }
  std::size_t total = 0;
  for (auto n : numel) total += n;
  if (!all(!numel.empty())) {
    if (rank_ == 0) std::fprintf(stderr, "mh_probe: no tensors in %s\n", csv);
    return 1;
  }
  std::vector<float> x(total, 1.0f);
  std::vector<double> ts;
  for (int i = 0; i <= reps; ++i) {  // the first round warms up
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    std::size_t off = 0;
    for (auto n : numel) {
      MPI_Allreduce(MPI_IN_PLACE, x.data() + off, int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      off += n;
    }
    double t = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (i > 0) ts.push_back(t);
  }
  if (rank_ == 0)
    std::printf("mh_probe tensors: %zu tensors, %.1f MiB, one MPI_Allreduce each: %.3f s (%.3f GB/s) [median of %d]\n",
                numel.size(), double(total * sizeof(float)) / (1 << 20), median(ts),
                double(total * sizeof(float)) / median(ts) / 1e9, reps);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  int rc = 2;
  const std::string mode = argc > 1 ? argv[1] : "";
  // The same arguments on every rank, so every rank takes the same branch.
  const int hosts = mode == "where" && argc == 5 ? std::atoi(argv[2]) : 0;
  const int per_host = argc > 2 ? std::atoi(argv[mode == "where" ? 3 : 2]) : 0;
  if (mode == "where" && argc == 5 && hosts >= 2 && per_host >= 1 && hosts * per_host == size_)
    rc = where(hosts, per_host, argv[4]);
  else if (mode == "bw" && argc >= 3 && per_host >= 1 && per_host < size_)
    rc = bw(per_host, argc > 3 ? std::max(1, std::atoi(argv[3])) : 5);
  else if (mode == "tensors" && argc >= 3)
    rc = tensors(argv[2], argc > 3 ? std::max(1, std::atoi(argv[3])) : 5);
  else if (rank_ == 0)
    std::fprintf(stderr,
                 "usage: mh_probe where HOSTS PER_HOST IFACE (HOSTS x PER_HOST ranks) | bw PER_HOST [REPS] | tensors "
                 "CSV [REPS]\n");
  MPI_Finalize();
  return rc;
}
