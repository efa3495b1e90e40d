#include "batchtune/training/checkpoint_lock.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"

namespace batchtune {

CheckpointLock::CheckpointLock(const std::string& dir) {
  const std::string path = dir + "/checkpoint.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw OptionError(Option::kCheckpoint, dir,
                      fmt::format("cannot open {} ({}); check the folder is writable", path,
                                  std::strerror(errno)));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    ::close(fd_);
    fd_ = -1;
    if (error == EWOULDBLOCK) {
      throw OptionError(Option::kCheckpoint, dir,
                        "another run is writing checkpoints there; wait for it to end, or give "
                        "another folder");
    }
    throw OptionError(Option::kCheckpoint, dir,
                      fmt::format("cannot lock {} ({})", path, std::strerror(error)));
  }
}

CheckpointLock::~CheckpointLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the lock
}

}  // namespace batchtune
