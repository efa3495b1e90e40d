#pragma once

#include <string>

namespace batchtune {

/// Writes `content` to `path` so that a reader (or an interruption) never
/// sees half of it: written to a temporary file beside it, flushed, then
/// renamed over `path`. Throws `batchtune::Error` naming the path.
///
/// Example:
/// ```
///   batchtune::write_file_atomically("out.json", json.dump(2));
/// ```
void write_file_atomically(const std::string& path, const std::string& content);

}  // namespace batchtune
