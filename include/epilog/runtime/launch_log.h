// A log of the kernels the CUDA launchers launch: what tests compare with what `explain` says
// (kernels/launch.h decides both). Off unless a LaunchLog is installed on the launching thread;
// then a launcher pays one thread-local load and test.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace epilog {

struct LaunchRecord {
  std::string node;    // the node the backend was running (empty outside one)
  std::string kernel;  // as explain's kernel column: "gemm", "gemm chain", "scalar", ...
  std::string tiles;   // as explain's tiles column: "halo m=128 n=64 k=72 stages=3 wgmma", ...
};

// Installed on the constructing thread for its lifetime (a log installed before it comes back
// after), it collects every launch the CUDA launchers on that thread make, in order. Launches
// captured into a CUDA graph are logged when captured, not when replayed.
class LaunchLog {
 public:
  LaunchLog();
  ~LaunchLog();
  LaunchLog(const LaunchLog&) = delete;
  LaunchLog& operator=(const LaunchLog&) = delete;

  // The log installed on this thread, or null.
  static LaunchLog* current();

  // The node the next launches are for (the CUDA backend sets it as it runs one).
  void set_node(std::string node) { node_ = std::move(node); }
  void add(std::string kernel, std::string tiles) {
    records_.push_back({node_, std::move(kernel), std::move(tiles)});
  }
  const std::vector<LaunchRecord>& records() const { return records_; }

 private:
  LaunchLog* previous_;
  std::string node_;
  std::vector<LaunchRecord> records_;
};

// For the launchers: logs (kernel, tiles()) where a log is installed; tiles() runs only then.
template <class Tiles>
void log_launch(const char* kernel, Tiles&& tiles) {
  if (LaunchLog* log = LaunchLog::current()) log->add(kernel, tiles());
}

}  // namespace epilog
