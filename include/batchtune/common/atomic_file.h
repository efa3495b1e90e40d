#pragma once

#include <string>

namespace batchtune {

/// Writes `content` to `path` so that a reader (or an interruption) never
/// sees half of it, and without damaging what `path` is:
/// - a regular file (or a new one) is written to a temporary file beside it,
///   flushed, then renamed over it, keeping an existing file's mode;
/// - a symbolic link is followed: its target is written, the link stays;
/// - a device, FIFO or socket (`/dev/null`, `/dev/stdout`, a named pipe) is
///   written directly: renaming over it would replace the node;
/// - `-` is standard output.
/// Any failure (a full device, a closed stdout, a missing folder) throws
/// `batchtune::Error` naming the path.
///
/// Example:
/// ```
///   batchtune::write_file_atomically("out.json", json.dump(2));
/// ```
void write_file_atomically(const std::string& path, const std::string& content);

/// Checks before any work that `path` can be written by
/// `write_file_atomically`: `-` needs an open stdout; a file needs an
/// existing, writable folder and must not be a folder itself nor a read-only
/// file. `flag` (`--json`) starts the message. Throws `batchtune::Error`.
void check_output_file(const std::string& path, const std::string& flag);

/// Call first in main(): when the process started with stdout closed
/// (`>&-`), /dev/null holds descriptor 1 so that no file opened later takes
/// it, and writes to `-` fail saying stdout is closed.
void guard_stdout();

/// Creates `dir` and its missing parents (like `mkdir -p`) and checks that
/// it is a writable folder; throws `batchtune::Error` starting with `flag`
/// and saying which step failed (for `--checkpoint DIR`).
void prepare_output_directory(const std::string& dir, const std::string& flag);

}  // namespace batchtune
