#include "batchtune/common/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "batchtune/common/error.h"

namespace batchtune {
namespace {

// Set by guard_stdout(): descriptor 1 is /dev/null standing in for a closed stdout.
bool g_stdout_closed = false;

// As the kernel's own limit on a path's chain of links (MAXSYMLINKS).
constexpr int kMaxSymlinkHops = 40;

std::string dirname_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

/// Follows `path`'s chain of symbolic links to the path it ends at, which
/// may not exist yet (a dangling link names the file to create).
std::string follow_links(const std::string& path) {
  std::string current = path;
  for (int hop = 0; hop < kMaxSymlinkHops; ++hop) {
    struct stat st {};
    if (::lstat(current.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return current;
    char target[PATH_MAX];
    const ssize_t n = ::readlink(current.c_str(), target, sizeof target - 1);
    if (n < 0) return current;
    target[n] = '\0';
    current = target[0] == '/' ? std::string(target) : dirname_of(current) + "/" + target;
  }
  throw Error(fmt::format("{}: cannot write (more than {} symbolic links in a chain)", path,
                          kMaxSymlinkHops));
}

/// Writes all of `content` to `fd`; false with errno set when it could not.
bool write_all(int fd, const std::string& content) {
  size_t written = 0;
  while (written < content.size()) {
    const ssize_t n = ::write(fd, content.data() + written, content.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) {
      errno = EIO;
      return false;
    }
    written += static_cast<size_t>(n);
  }
  return true;
}

Error write_error(const std::string& path, const char* step, int error) {
  return Error(fmt::format("{}: cannot write ({}: {}); check the folder exists and is writable "
                           "and the device is not full",
                           path == "-" ? "standard output" : path, step, std::strerror(error)));
}

/// A device, FIFO, socket or stdout: written in place, never replaced.
void write_directly(const std::string& path, int fd, const std::string& content, bool owned) {
  if (!write_all(fd, content)) {
    const int error = errno;
    if (owned) ::close(fd);
    throw write_error(path, "write", error);
  }
  if (owned && ::close(fd) != 0) throw write_error(path, "close", errno);
}

}  // namespace

void guard_stdout() {
  if (::fcntl(STDOUT_FILENO, F_GETFD) >= 0) return;
  g_stdout_closed = true;
  const int fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  if (fd >= 0 && fd != STDOUT_FILENO) {
    ::dup2(fd, STDOUT_FILENO);
    ::close(fd);
  }
}

void write_file_atomically(const std::string& path, const std::string& content) {
  if (path == "-") {
    if (g_stdout_closed) throw write_error(path, "write", EBADF);
    std::cout.flush();
    if (!std::cout) throw write_error(path, "write", EIO);
    write_directly(path, STDOUT_FILENO, content, /*owned=*/false);
    return;
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    if (S_ISDIR(st.st_mode)) throw write_error(path, "open", EISDIR);
    // Opened through the links as they are: /dev/stdout is a link to
    // /proc/self/fd/1, whose own target may be "pipe:[…]".
    const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
    if (fd < 0) throw write_error(path, "open", errno);
    write_directly(path, fd, content, /*owned=*/true);
    return;
  }
  const std::string target = follow_links(path);
  struct stat existing {};
  const bool exists = ::stat(target.c_str(), &existing) == 0;
  const std::string temporary = target + ".tmp." + std::to_string(getpid());
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) throw write_error(path, "open", errno);
  const auto fail = [&](const char* step) {
    const int error = errno;
    ::close(fd);
    ::unlink(temporary.c_str());
    return write_error(path, step, error);
  };
  if (exists) {
    // The replacement keeps the file's mode (and, where allowed, owner).
    if (::fchmod(fd, existing.st_mode & 07777) != 0) throw fail("fchmod");
    if (::fchown(fd, existing.st_uid, existing.st_gid) != 0) errno = 0;
  }
  if (!write_all(fd, content)) throw fail("write");
  if (::fsync(fd) != 0) throw fail("fsync");
  if (::close(fd) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    throw write_error(path, "close", error);
  }
  if (std::rename(temporary.c_str(), target.c_str()) != 0) {
    const int error = errno;
    ::unlink(temporary.c_str());
    throw write_error(path, "rename", error);
  }
}

void check_output_file(const std::string& path, const std::string& flag) {
  if (path.empty()) return;
  if (path == "-") {
    if (g_stdout_closed || ::fcntl(STDOUT_FILENO, F_GETFL) < 0) {
      throw Error(fmt::format("{} -: standard output is closed; give a file instead", flag));
    }
    return;
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) {
      throw Error(fmt::format("{} {}: is a folder; give a file name", flag, path));
    }
    if (::access(path.c_str(), W_OK) != 0) {
      throw Error(fmt::format("{} {}: cannot be written ({}); choose another file", flag, path,
                              std::strerror(errno)));
    }
    if (!S_ISREG(st.st_mode)) return;  // a device or FIFO is written in place
  }
  // A new or replaced file is made in its folder (a temporary, renamed).
  const std::string dir = dirname_of(follow_links(path));
  struct stat folder {};
  if (::stat(dir.c_str(), &folder) != 0) {
    throw Error(fmt::format("{} {}: the folder {} does not exist; create it first", flag, path,
                            dir));
  }
  if (!S_ISDIR(folder.st_mode)) {
    throw Error(fmt::format("{} {}: {} is not a folder", flag, path, dir));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    throw Error(fmt::format("{} {}: the folder {} is not writable ({}); choose another place",
                            flag, path, dir, std::strerror(errno)));
  }
  // access() says yes to root on a read-only or virtual file system
  // (/proc/version): only making the temporary file the write will make
  // tells for sure.
  const std::string probe = fmt::format("{}/.batchtune-check.{}", dir, ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw Error(fmt::format("{} {}: cannot make a file in the folder {} ({}); choose another "
                            "place",
                            flag, path, dir, std::strerror(errno)));
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

void prepare_output_directory(const std::string& dir, const std::string& flag) {
  if (dir.empty()) return;
  // Each missing component in turn, as `mkdir -p`.
  for (size_t end = dir.find('/', 1);; end = dir.find('/', end + 1)) {
    const std::string part = dir.substr(0, end);
    if (!part.empty() && ::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
      throw Error(fmt::format("{} {}: cannot create the folder {} (mkdir: {})", flag, dir, part,
                              std::strerror(errno)));
    }
    if (end == std::string::npos) break;
  }
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw Error(fmt::format("{} {}: exists and is not a folder; give a folder", flag, dir));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    throw Error(fmt::format("{} {}: the folder is not writable ({}); choose another place", flag,
                            dir, std::strerror(errno)));
  }
}

}  // namespace batchtune
