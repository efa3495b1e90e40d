#pragma once

#include <string>

namespace batchtune {

/// Holds `dir/checkpoint.lock` (an advisory `flock`) while one run writes
/// `dir`, so that a second run given the same folder stops at once instead
/// of interleaving checkpoints; the kernel releases it when the process ends,
/// however it ends. Throws `batchtune::Error` naming the folder.
///
/// Example:
/// ```
///   batchtune::CheckpointLock lock("ckpt");  // held until it goes out of scope
/// ```
class CheckpointLock {
 public:
  explicit CheckpointLock(const std::string& dir);
  ~CheckpointLock();
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace batchtune
