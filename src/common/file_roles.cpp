#include "batchtune/common/file_roles.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "batchtune/common/error.h"
#include "batchtune/common/option.h"

namespace batchtune {
namespace {

/// Where a path leads: its file's identity when it exists, else the
/// canonical path it would be created at.
struct Resolved {
  std::string path;  // canonical, or as given when even the folder is missing
  std::optional<std::pair<dev_t, ino_t>> inode;
  bool device = false;  // a character or block device, FIFO or socket
  bool folder = false;
  bool standard_stream = false;  // "-"
};

// As the kernel's own limit on a chain of links (MAXSYMLINKS).
constexpr int kMaxLinkHops = 40;

Resolved resolve_missing(const std::string& path);

std::string canonical(const std::string& path) {
  char buffer[PATH_MAX];
  return ::realpath(path.c_str(), buffer) != nullptr ? std::string(buffer) : std::string();
}

Resolved resolve(const std::string& path) {
  Resolved r;
  if (path == "-") {
    r.standard_stream = true;
    r.path = "-";
    return r;
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    r.inode = std::make_pair(st.st_dev, st.st_ino);
    r.device = !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode);
    r.folder = S_ISDIR(st.st_mode);
    r.path = canonical(path);
    if (r.path.empty()) r.path = path;
    return r;
  }
  // A file to be created: its folder's canonical path and its name, after
  // following a dangling link to the target it names (the writer creates
  // the target).
  std::string target = path;
  for (int hop = 0; hop < kMaxLinkHops; ++hop) {
    struct stat link {};
    if (::lstat(target.c_str(), &link) != 0 || !S_ISLNK(link.st_mode)) break;
    char buffer[PATH_MAX];
    const ssize_t n = ::readlink(target.c_str(), buffer, sizeof buffer - 1);
    if (n < 0) break;
    buffer[n] = '\0';
    const size_t at = target.find_last_of('/');
    target = buffer[0] == '/' || at == std::string::npos
                 ? std::string(buffer)
                 : target.substr(0, at + 1) + buffer;
  }
  return resolve_missing(target);
}

Resolved resolve_missing(const std::string& path) {
  Resolved r;
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  const std::string real_dir = canonical(dir);
  r.path = real_dir.empty() ? path : (real_dir == "/" ? "/" : real_dir + "/") + name;
  return r;
}

bool same_file(const Resolved& a, const Resolved& b) {
  if (a.standard_stream || b.standard_stream) return a.standard_stream && b.standard_stream;
  if (a.inode && b.inode) return *a.inode == *b.inode;
  return a.path == b.path;
}

bool inside(const Resolved& file, const Resolved& folder) {
  if (file.standard_stream || folder.path.empty()) return false;
  const std::string prefix = folder.path == "/" ? "/" : folder.path + "/";
  return file.path.rfind(prefix, 0) == 0;
}

const char* verb(FileAccess access) {
  return access == FileAccess::kWrite ? "written as" : "read as";
}

}  // namespace

void check_file_roles(const std::vector<FileRole>& roles) {
  std::vector<Resolved> resolved;
  resolved.reserve(roles.size());
  for (const FileRole& role : roles) resolved.push_back(resolve(role.path));
  for (size_t i = 0; i < roles.size(); ++i) {
    if (roles[i].path.empty() || roles[i].access != FileAccess::kWrite) continue;
    if (resolved[i].device) continue;  // /dev/null takes any number of writes
    for (size_t j = 0; j < roles.size(); ++j) {
      if (j == i || roles[j].path.empty()) continue;
      if (roles[j].access == FileAccess::kReadFolder) {
        if (inside(resolved[i], resolved[j])) {
          throw Error(fmt::format(
              "{} {}: is inside the {} folder {}, which this command reads as data; write it "
              "elsewhere",
              roles[i].flag, roles[i].path, roles[j].flag, roles[j].path));
        }
        continue;
      }
      // Each pair of writes once; a write against every read.
      if (roles[j].access == FileAccess::kWrite && j < i) continue;
      if (!same_file(resolved[i], resolved[j])) continue;
      if (resolved[i].standard_stream) {
        throw Error(fmt::format("{} -: {} also writes to standard output; give one of them a file",
                                roles[i].flag, roles[j].flag));
      }
      throw Error(fmt::format("{} {}: is the file also {} {} ({}); one would destroy the other, "
                              "so give another file",
                              roles[i].flag, roles[i].path, verb(roles[j].access), roles[j].flag,
                              roles[j].path));
    }
  }
}

void check_input_file(const std::string& path, Option option) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw OptionError(option, path,
                      fmt::format("cannot read ({}); check the path", std::strerror(errno)));
  }
  if (S_ISDIR(st.st_mode)) throw OptionError(option, path, "is a folder; give a file");
  if (!S_ISREG(st.st_mode)) {
    const char* kind = S_ISFIFO(st.st_mode)   ? "a named pipe (FIFO)"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                                              : "a device";
    throw OptionError(option, path, fmt::format("is {}, not a regular file; give a file", kind));
  }
  if (::access(path.c_str(), R_OK) != 0) {
    throw OptionError(option, path,
                      fmt::format("cannot read ({}); check its permissions", std::strerror(errno)));
  }
}

}  // namespace batchtune
