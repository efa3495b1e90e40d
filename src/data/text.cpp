#include "batchtune/data/text.h"

#include <ATen/ATen.h>
#include <dirent.h>
#include <sys/stat.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <numeric>
#include <set>
#include <sstream>

#include "batchtune/common/crc32.h"
#include "batchtune/common/error.h"
#include "batchtune/common/option.h"

namespace batchtune {
namespace {

/// Bytes read of one file at most: a text file larger than this is a data
/// dump, not a document, and reading it whole would take the host's memory.
constexpr off_t kMaxDocumentBytes = off_t{16} << 20;
/// Folder depth followed at most (a link loop ends here).
constexpr int kMaxDepth = 16;

// POSIX, not std::filesystem: the torch wheel's libtorch.so exports its own
// std::filesystem symbols, and they crash when called from here.
/// Files and folders by identity: a link back up (`again -> .`) or a second
/// link to one file is read once.
using Seen = std::set<std::pair<dev_t, ino_t>>;

void list_files(const std::string& dir, int depth, std::vector<std::string>& files, Seen& seen) {
  DIR* handle = ::opendir(dir.c_str());
  if (handle == nullptr) return;
  // By name, so that which of two links to one file is read does not
  // depend on the file system's order.
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(handle)) names.emplace_back(entry->d_name);
  ::closedir(handle);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    if (name == "." || name == "..") continue;
    const std::string path = dir + "/" + name;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) continue;
    if (!seen.insert({st.st_dev, st.st_ino}).second) continue;
    if (S_ISDIR(st.st_mode)) {
      if (depth < kMaxDepth) list_files(path, depth + 1, files, seen);
    } else if (S_ISREG(st.st_mode) && st.st_size <= kMaxDocumentBytes) {
      files.push_back(path);
    }
  }
}

std::vector<std::string> text_files(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    throw OptionError(Option::kData, "text:" + dir,
                      "not a folder; give a folder of text files, like "
                      "text:/usr/share/common-licenses");
  }
  std::vector<std::string> files;
  Seen seen = {{st.st_dev, st.st_ino}};
  list_files(dir, 0, files, seen);
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TextDataset::TextDataset(const std::string& dir, LengthRange range) : dir_(dir), range_(range) {
  if (range.min < 1 || range.max < range.min) {
    throw OptionError(Option::kInput,
                      fmt::format("text needs a length range like int64:16..512, got {}..{}",
                                  range.min, range.max));
  }
  std::string all;
  for (const std::string& path : text_files(dir)) {
    std::ifstream in(path, std::ios::binary);
    if (!in) continue;  // unreadable: not this data set's business
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (text.find('\0') != std::string::npos) continue;  // binary (a .gz, an image)
    // Windows line ends: "\r\n\r\n" separates paragraphs as "\n\n" does.
    text.erase(std::remove(text.begin(), text.end(), '\r'), text.end());
    ++documents_;
    // Paragraphs: text between blank lines; each n bytes long gives n − 1 tokens.
    size_t begin = 0;
    while (begin < text.size()) {
      size_t end = text.find("\n\n", begin);
      if (end == std::string::npos) end = text.size();
      for (size_t piece = begin; piece < end;) {
        const size_t bytes = std::min<size_t>(end - piece, static_cast<size_t>(range.max) + 1);
        const auto tokens = static_cast<int64_t>(bytes) - 1;
        if (tokens >= range.min) {
          offsets_.push_back(static_cast<int64_t>(all.size()));
          lengths_.push_back(tokens);
          all.append(text, piece, bytes);
        }
        piece += bytes;
      }
      begin = end + 2;
    }
  }
  if (lengths_.empty()) {
    throw OptionError(Option::kData, "text:" + dir,
                      fmt::format("no paragraph of {} to {} tokens in {} text file(s); give a "
                                  "folder of text files, like text:/usr/share/common-licenses",
                                  range.min, range.max, documents_));
  }
  // The lengths too: the same bytes cut into other paragraphs are other samples.
  digest_ = crc32_of(lengths_.data(), lengths_.size() * sizeof(int64_t),
                     crc32_of(all.data(), all.size()));
  bytes_ = at::empty({static_cast<int64_t>(all.size())}, at::kByte);
  std::memcpy(bytes_.data_ptr(), all.data(), all.size());
}

LengthRange TextDataset::length_range() const {
  const auto [lo, hi] = std::minmax_element(lengths_.begin(), lengths_.end());
  return {*lo, *hi};
}

Batch TextDataset::get_batch(const std::vector<int64_t>& indices) const {
  int64_t longest = pad_to_;
  for (int64_t i : indices) longest = std::max(longest, lengths_.at(static_cast<size_t>(i)));
  const auto b = static_cast<int64_t>(indices.size());
  at::Tensor inputs = at::zeros({b, longest}, at::kLong);
  at::Tensor targets = at::full({b, longest}, kIgnoreTarget, at::kLong);
  auto in = inputs.accessor<int64_t, 2>();
  auto out = targets.accessor<int64_t, 2>();
  const auto* bytes = bytes_.data_ptr<uint8_t>();
  for (int64_t row = 0; row < b; ++row) {
    const auto i = static_cast<size_t>(indices[static_cast<size_t>(row)]);
    const uint8_t* sample = bytes + offsets_[i];
    for (int64_t t = 0; t < lengths_[i]; ++t) {
      in[row][t] = sample[t];
      out[row][t] = sample[t + 1];
    }
  }
  Batch batch;
  batch.inputs.push_back(inputs);
  batch.target = targets;
  return batch;
}

std::string TextDataset::describe() const {
  const LengthRange r = length_range();
  const int64_t tokens = std::accumulate(lengths_.begin(), lengths_.end(), int64_t{0});
  return fmt::format("text {} ({} paragraphs of {} files, {}..{} tokens, {} tokens in all)", dir_,
                     lengths_.size(), documents_, r.min, r.max, tokens);
}

}  // namespace batchtune
