#include "batchtune/common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "batchtune/common/error.h"

namespace batchtune {

void write_file_atomically(const std::string& path, const std::string& content) {
  const auto fail = [&](const char* step) {
    return Error(path + ": cannot write (" + step + ": " + std::strerror(errno) +
                 "); check the directory exists and is writable");
  };
  const std::string temporary = path + ".tmp." + std::to_string(getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw fail("open");
  size_t written = 0;
  while (written < content.size()) {
    const ssize_t n = ::write(fd, content.data() + written, content.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const Error error = fail("write");
      ::close(fd);
      ::unlink(temporary.c_str());
      throw error;
    }
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const Error error = fail("fsync");
    ::unlink(temporary.c_str());
    throw error;
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const Error error = fail("rename");
    ::unlink(temporary.c_str());
    throw error;
  }
}

}  // namespace batchtune
