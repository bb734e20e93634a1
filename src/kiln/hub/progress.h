// The progress line of pull and upload on stderr: on a terminal, one line redrawn every 250 ms
// ("[pull] [=====     ]  45% 120.3 MB / 266.0 MB  12.3 MB/s  3/7 files"); elsewhere one line per
// finished file. Workers add bytes and finished files from any thread.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace kiln::hub {

std::string format_bytes(double bytes);  // "1.2 MB"

class ProgressLine {
 public:
  // enabled = false: silent. total_bytes / files: what this run moves.
  ProgressLine(std::string label, bool enabled, uint64_t total_bytes, size_t files);
  ~ProgressLine();  // stops the redraw and ends the line
  void add(int64_t bytes) { bytes_ += bytes; }
  void file_done(const std::string& path, uint64_t size);

 private:
  void draw(bool last);
  std::string label_;
  bool enabled_, tty_;
  uint64_t total_;
  size_t files_;
  std::atomic<int64_t> bytes_{0};
  std::atomic<size_t> done_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace kiln::hub
