// The progress line (progress.h).
#include "kiln/hub/progress.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

#include <fmt/format.h>

namespace kiln::hub {

std::string format_bytes(double b) {
  const char* u[] = {"B", "kB", "MB", "GB", "TB"};
  int i = 0;
  while (b >= 1000 && i < 4) b /= 1000, ++i;
  return i ? fmt::format("{:.1f} {}", b, u[i]) : fmt::format("{:.0f} {}", b, u[i]);
}

ProgressLine::ProgressLine(std::string label, bool enabled, uint64_t total_bytes, size_t files)
    : label_(std::move(label)), enabled_(enabled && files > 0), tty_(isatty(fileno(stderr))), total_(total_bytes),
      files_(files), t0_(std::chrono::steady_clock::now()) {
  if (!enabled_ || !tty_) return;
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lk(mu_);
    while (!cv_.wait_for(lk, std::chrono::milliseconds(250), [this] { return stop_; })) draw(false);
  });
}

ProgressLine::~ProgressLine() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  draw(true);
}

void ProgressLine::file_done(const std::string& path, uint64_t size) {
  ++done_;
  if (enabled_ && !tty_) {
    std::lock_guard<std::mutex> g(mu_);
    std::fprintf(stderr, "[%s] %s (%s)\n", label_.c_str(), path.c_str(), format_bytes(static_cast<double>(size)).c_str());
  }
}

void ProgressLine::draw(bool last) {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  const double b = static_cast<double>(std::max<int64_t>(bytes_.load(), 0)), t = static_cast<double>(total_);
  const int pct = t > 0 ? std::min(100, static_cast<int>(100.0 * b / t)) : 100;
  const int width = 30, fill = pct * width / 100;
  std::fprintf(stderr, "\r[%s] [%.*s%*s] %3d%% %s / %s  %s/s  %zu/%zu files ", label_.c_str(), fill,
               "==============================", width - fill, "", pct, format_bytes(b).c_str(), format_bytes(t).c_str(),
               format_bytes(s > 0 ? b / s : 0).c_str(), done_.load(), files_);
  if (last) std::fputc('\n', stderr);
}

}  // namespace kiln::hub
