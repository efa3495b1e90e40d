#pragma once

#include <string>
#include <vector>

#include "batchtune/common/option.h"

namespace batchtune {

/// What a command does with a path a flag gave it.
enum class FileAccess {
  kRead,        // a file read (--plan, --model, --input-spec)
  kWrite,       // a file written (--json, --report, a checkpoint's files)
  kReadFolder,  // a folder whose files are read (--data DIR)
};

/// One path a command reads or writes, with the flag that named it.
struct FileRole {
  std::string flag;  // "--json"; what the message names
  std::string path;
  FileAccess access = FileAccess::kRead;
};

/// Checks before any work that no file is written twice or read and written
/// by one command, comparing the files the paths resolve to (through
/// symbolic links, `..` and hard links), not their spellings:
/// - two writes to one file, or two to standard output (`-`);
/// - a write to a file the command also reads (`--json` onto `--plan`);
/// - a write inside a folder the command reads (`--json` among `--data`'s
///   files, which a later run would take for data).
/// Devices such as `/dev/null` may take any number of writes. Empty paths
/// are skipped. Throws `batchtune::Error` naming both flags.
///
/// Example:
/// ```
///   check_file_roles({{"--plan", "p.json", FileAccess::kRead},
///                     {"--json", "p.json", FileAccess::kWrite}});  // throws
/// ```
void check_file_roles(const std::vector<FileRole>& roles);

/// Checks that `path` is a readable regular file (after following links)
/// before it is opened: a FIFO would block the open, a folder or device is
/// not what the option takes. Throws `OptionError` about `option` and `path`
/// ("--plan p.json: is a folder; give a file").
void check_input_file(const std::string& path, Option option);

}  // namespace batchtune
