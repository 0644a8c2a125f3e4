// Test helpers for the pressure-source tests: a temp dir, file writes, and an
// event log that tests can wait on with a deadline (never a sleep).
#pragma once

#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "arbiter/base/mutex.h"
#include "arbiter/memory/memory_pressure.h"

namespace arbiter::testing_util {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "arbiter_pressure_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Writes `text` to `path` (truncating).
inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

class EventLog {
 public:
  MemoryPressureListener Listener() {
    return [this](const MemoryPressureEvent& e) {
      MutexLock l(&mu_);
      events_.push_back(e);
      cv_.SignalAll();
    };
  }
  std::vector<MemoryPressureEvent> Events() {
    MutexLock l(&mu_);
    return events_;
  }
  std::vector<MemoryPressureLevel> Levels() {
    MutexLock l(&mu_);
    std::vector<MemoryPressureLevel> out;
    for (const auto& e : events_) out.push_back(e.level);
    return out;
  }
  size_t size() {
    MutexLock l(&mu_);
    return events_.size();
  }
  // A fuse, not a sleep: returns as soon as an event of `level` arrived.
  bool WaitForLevel(MemoryPressureLevel level, std::chrono::milliseconds fuse) {
    auto deadline = std::chrono::steady_clock::now() + fuse;
    MutexLock l(&mu_);
    while (true) {
      for (const auto& e : events_) {
        if (e.level == level) return true;
      }
      if (!cv_.WaitUntil(deadline) && std::chrono::steady_clock::now() >= deadline) return false;
    }
  }

 private:
  Mutex mu_;
  CondVar cv_{&mu_};
  std::vector<MemoryPressureEvent> events_ GUARDED_BY(mu_);
};

}  // namespace arbiter::testing_util
