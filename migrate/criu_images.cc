#include "migrate/criu_images.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/fd_io.h"
#include "core/status.h"
#include "core/unique_fd.h"

namespace stretch {
namespace {

constexpr uint32_t kImgCommonMagic = 0x54564319;
constexpr uint32_t kPagemapMagic = 0x56084025;
// A pagemap record is a handful of varints; anything larger is corrupt.
constexpr uint32_t kMaxRecord = 64;

// Minimal protobuf decoding for the two record types: varint fields only.
class ProtoReader {
 public:
  explicit ProtoReader(absl::Span<const uint8_t> in) : in_(in) {}
  bool done() const { return pos_ == in_.size(); }
  size_t pos() const { return pos_; }

  // Skips the value of a field of wire type `type`; its bytes are [start, pos()) after.
  bool Skip(uint32_t type) {
    uint64_t v;
    switch (type) {
      case 0:
        return Varint(&v);
      case 1:
        return Bytes(8);
      case 2:
        return Varint(&v) && v <= in_.size() && Bytes(static_cast<size_t>(v));
      case 5:
        return Bytes(4);
      default:  // groups (3, 4) are not used by CRIU's images
        return false;
    }
  }
  bool Bytes(size_t n) {
    if (n > in_.size() - pos_) return false;
    pos_ += n;
    return true;
  }

  // Reads a varint; false on truncation or overlong encoding.
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ == in_.size()) return false;
      uint8_t b = in_[pos_++];
      *v |= uint64_t{b & 0x7Fu} << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }

 private:
  absl::Span<const uint8_t> in_;
  size_t pos_ = 0;
};

absl::Status Bad(const std::string& name, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("CRIU image ", name, ": ", what));
}

// Calls on_field(number, value) for each varint field; rejects other wire types.
template <typename F>
absl::Status ParseVarintMessage(absl::Span<const uint8_t> rec, const std::string& name,
                                F&& on_field) {
  ProtoReader r(rec);
  while (!r.done()) {
    uint64_t key, value;
    if (!r.Varint(&key)) return Bad(name, "truncated field key");
    if ((key & 7) != 0) {
      return Bad(name,
                 absl::StrFormat("field %d has wire type %d, expected varint", key >> 3, key & 7));
    }
    if (!r.Varint(&value)) return Bad(name, "truncated varint");
    on_field(static_cast<uint32_t>(key >> 3), value);
  }
  return absl::OkStatus();
}

void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

// `msg` without its fields `drop` (any wire type); fields `nested` (length-delimited
// messages) rewritten by nested(number, bytes). Other fields are copied as they are.
template <typename Nested>
absl::StatusOr<std::string> FilterFields(absl::Span<const uint8_t> msg, const std::string& name,
                                         absl::Span<const uint32_t> drop, Nested&& nested) {
  std::string out;
  ProtoReader r(msg);
  while (!r.done()) {
    const size_t start = r.pos();
    uint64_t key;
    if (!r.Varint(&key)) return Bad(name, "truncated field key");
    const uint32_t number = static_cast<uint32_t>(key >> 3), type = key & 7;
    const size_t value_start = r.pos();
    if (!r.Skip(type))
      return Bad(name, absl::StrFormat("field %d is truncated or corrupt", number));
    if (std::find(drop.begin(), drop.end(), number) != drop.end()) continue;
    std::optional<std::string> rewritten;
    if (type == 2) {
      ProtoReader len(msg.subspan(value_start));
      uint64_t n;
      len.Varint(&n);
      STRETCH_ASSIGN_OR_RETURN(rewritten, nested(number, msg.subspan(value_start + len.pos(), n)));
    }
    if (rewritten) {
      PutVarint(key, &out);
      PutVarint(rewritten->size(), &out);
      out += *rewritten;
    } else {
      out.append(reinterpret_cast<const char*>(msg.data() + start), r.pos() - start);
    }
  }
  return out;
}

// The two u32 magics every CRIU image but the inventory starts with: IMG_COMMON, then the
// image's own (`what` names it in the error).
absl::Status CheckMagic(absl::Span<const uint8_t> bytes, const std::string& name, uint32_t magic,
                        const char* what) {
  if (bytes.size() < 8) return Bad(name, "shorter than its 8-byte magic");
  uint32_t m0, m1;
  std::memcpy(&m0, bytes.data(), 4);
  std::memcpy(&m1, bytes.data() + 4, 4);
  if (m0 != kImgCommonMagic || m1 != magic) {
    return Bad(name, absl::StrFormat("magic 0x%08x 0x%08x is not a CRIU %s", m0, m1, what));
  }
  return absl::OkStatus();
}

// The record at *pos of an image (a 4-byte length, then that many bytes, at most `max`), and
// *pos past it.
absl::StatusOr<absl::Span<const uint8_t>> NextRecord(absl::Span<const uint8_t> bytes,
                                                     const std::string& name, size_t max,
                                                     size_t* pos) {
  if (bytes.size() - *pos < 4) return Bad(name, "truncated record length");
  uint32_t len;
  std::memcpy(&len, bytes.data() + *pos, 4);
  *pos += 4;
  if (len > max || len > bytes.size() - *pos) {
    return Bad(name, absl::StrFormat("record of %u bytes at offset %u is corrupt", len, *pos - 4));
  }
  auto rec = bytes.subspan(*pos, len);
  *pos += len;
  return rec;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("open ", path));
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = read(fd.get(), buf, sizeof(buf));
    if (n < 0) return ErrnoStatus(errno, absl::StrCat("read ", path));
    if (n == 0) break;
    out.append(buf, n);
  }
  return out;
}

}  // namespace

absl::StatusOr<Pagemap> ParsePagemap(absl::Span<const uint8_t> bytes, const std::string& name) {
  STRETCH_RETURN_IF_ERROR(CheckMagic(bytes, name, kPagemapMagic, "pagemap"));
  Pagemap pm;
  bool have_head = false;
  size_t pos = 8;
  while (pos < bytes.size()) {
    STRETCH_ASSIGN_OR_RETURN(auto rec, NextRecord(bytes, name, kMaxRecord, &pos));
    if (!have_head) {
      bool got_id = false;
      STRETCH_RETURN_IF_ERROR(ParseVarintMessage(rec, name, [&](uint32_t f, uint64_t v) {
        if (f == 1) {
          pm.pages_id = static_cast<uint32_t>(v);
          got_id = true;
        }
      }));
      if (!got_id) return Bad(name, "pagemap_head lacks pages_id");
      have_head = true;
      continue;
    }
    PagemapEntry e;
    bool got_vaddr = false, got_nr = false;
    STRETCH_RETURN_IF_ERROR(ParseVarintMessage(rec, name, [&](uint32_t f, uint64_t v) {
      switch (f) {
        case 1:
          e.vaddr = v;
          got_vaddr = true;
          break;
        case 2:
          e.nr_pages = static_cast<uint32_t>(v);
          got_nr = true;
          break;
        case 3:
          e.in_parent = v != 0;
          break;
        case 4:
          e.flags = static_cast<uint32_t>(v);
          break;
        default:
          break;  // unknown optional fields are skipped, as protobuf does
      }
    }));
    if (!got_vaddr || !got_nr) return Bad(name, "pagemap_entry lacks vaddr or nr_pages");
    if (!IsPageAligned(e.vaddr) || e.vaddr >= kUserAddressLimit ||
        e.nr_pages > (kUserAddressLimit - e.vaddr) / kPageSize) {
      return Bad(name, absl::StrFormat("entry at 0x%x with %u pages is outside user space", e.vaddr,
                                       e.nr_pages));
    }
    pm.entries.push_back(e);
  }
  if (!have_head) return Bad(name, "no pagemap_head record");
  return pm;
}

absl::StatusOr<CheckpointMemory> CheckpointMemory::Open(const std::string& images_dir, pid_t pid) {
  std::string pm_path = absl::StrCat(images_dir, "/pagemap-", pid, ".img");
  STRETCH_ASSIGN_OR_RETURN(std::string pm_bytes, ReadFile(pm_path));
  CheckpointMemory mem;
  STRETCH_ASSIGN_OR_RETURN(
      mem.pagemap_,
      ParsePagemap(absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(pm_bytes.data()),
                                             pm_bytes.size()),
                   pm_path));

  uint64_t offset = 0;
  for (const auto& e : mem.pagemap_.entries) {
    if (!(e.flags & kPagemapPresent)) continue;
    if (e.in_parent || (e.flags & kPagemapParent)) {
      return Bad(pm_path, "incremental dumps (pages in a parent image) are not supported");
    }
    mem.runs_.push_back(Run{e.vaddr, e.nr_pages, offset});
    offset += uint64_t{e.nr_pages} * kPageSize;
  }
  std::sort(mem.runs_.begin(), mem.runs_.end(),
            [](const Run& a, const Run& b) { return a.vaddr < b.vaddr; });
  for (size_t i = 1; i < mem.runs_.size(); ++i) {
    const Run& p = mem.runs_[i - 1];
    if (p.vaddr + p.nr_pages * kPageSize > mem.runs_[i].vaddr) {
      return Bad(pm_path, absl::StrFormat("entries overlap at 0x%x", mem.runs_[i].vaddr));
    }
  }

  std::string pages_path = absl::StrCat(images_dir, "/pages-", mem.pagemap_.pages_id, ".img");
  UniqueFd fd(open(pages_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("open ", pages_path));
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("fstat ", pages_path));
  if (static_cast<uint64_t>(st.st_size) != offset) {
    return Bad(pages_path,
               absl::StrFormat("has %d bytes, the pagemap describes %u", st.st_size, offset));
  }
  if (offset > 0) {
    void* p = mmap(nullptr, offset, PROT_READ, MAP_PRIVATE, fd.get(), 0);
    if (p == MAP_FAILED) return ErrnoStatus(errno, absl::StrCat("mmap ", pages_path));
    mem.base_ = static_cast<const uint8_t*>(p);
    mem.bytes_ = offset;
  }
  return mem;
}

CheckpointMemory::CheckpointMemory(CheckpointMemory&& other) noexcept
    : pagemap_(std::move(other.pagemap_)),
      runs_(std::move(other.runs_)),
      base_(std::exchange(other.base_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

CheckpointMemory& CheckpointMemory::operator=(CheckpointMemory&& other) noexcept {
  if (this != &other) {
    if (base_) munmap(const_cast<uint8_t*>(base_), bytes_);
    pagemap_ = std::move(other.pagemap_);
    runs_ = std::move(other.runs_);
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

CheckpointMemory::~CheckpointMemory() {
  if (base_) munmap(const_cast<uint8_t*>(base_), bytes_);
}

std::optional<absl::Span<const uint8_t>> CheckpointMemory::Find(uintptr_t address) const {
  uint64_t page = PageDown(address);
  auto it = std::upper_bound(runs_.begin(), runs_.end(), page,
                             [](uint64_t a, const Run& r) { return a < r.vaddr; });
  if (it == runs_.begin()) return std::nullopt;
  --it;
  if (page >= it->vaddr + it->nr_pages * kPageSize) return std::nullopt;
  return absl::Span<const uint8_t>(base_ + it->offset + (page - it->vaddr), kPageSize);
}

absl::StatusOr<std::string> CoreImageWithoutSeccomp(absl::Span<const uint8_t> bytes,
                                                    const std::string& name) {
  constexpr uint32_t kCoreMagic = 0x55053847;
  STRETCH_RETURN_IF_ERROR(CheckMagic(bytes, name, kCoreMagic, "core image"));
  // core_entry: tc = 3 (task_core_entry), thread_core = 5 (thread_core_entry); in both,
  // 11 and 12 are the seccomp mode and filter index.
  constexpr uint32_t kSeccompFields[] = {11, 12};
  auto in_core =
      [&](uint32_t number,
          absl::Span<const uint8_t> value) -> absl::StatusOr<std::optional<std::string>> {
    if (number != 3 && number != 5) return std::nullopt;
    auto keep = [](uint32_t,
                   absl::Span<const uint8_t>) -> absl::StatusOr<std::optional<std::string>> {
      return std::nullopt;
    };
    STRETCH_ASSIGN_OR_RETURN(std::string inner, FilterFields(value, name, kSeccompFields, keep));
    return std::optional<std::string>(std::move(inner));
  };
  std::string out(reinterpret_cast<const char*>(bytes.data()), 8);
  size_t pos = 8;
  while (pos < bytes.size()) {
    STRETCH_ASSIGN_OR_RETURN(auto rec, NextRecord(bytes, name, bytes.size(), &pos));
    STRETCH_ASSIGN_OR_RETURN(std::string entry, FilterFields(rec, name, {}, in_core));
    const uint32_t n = static_cast<uint32_t>(entry.size());
    out.append(reinterpret_cast<const char*>(&n), 4);
    out += entry;
  }
  return out;
}

absl::StatusOr<int> RemoveSeccompFilters(const std::string& images_dir) {
  std::error_code ec;
  int changed = 0;
  for (const auto& e : std::filesystem::directory_iterator(images_dir, ec)) {
    const std::string file = e.path().filename().string();
    if (!absl::StartsWith(file, "core-") || !absl::EndsWith(file, ".img")) continue;
    STRETCH_ASSIGN_OR_RETURN(std::string bytes, ReadFile(e.path().string()));
    STRETCH_ASSIGN_OR_RETURN(
        std::string out,
        CoreImageWithoutSeccomp(
            absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
            file));
    if (out == bytes) continue;
    const std::string tmp = e.path().string() + ".tmp";
    {
      UniqueFd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
      if (!fd.valid()) return ErrnoStatus(errno, absl::StrCat("open ", tmp));
      if (!WriteFull(fd.get(), out.data(), out.size())) {
        return ErrnoStatus(errno, absl::StrCat("write ", tmp));
      }
    }
    if (rename(tmp.c_str(), e.path().c_str()) != 0) {
      return ErrnoStatus(errno, absl::StrCat("rename ", tmp));
    }
    ++changed;
  }
  if (ec) return absl::InternalError(absl::StrCat("listing ", images_dir, ": ", ec.message()));
  return changed;
}

}  // namespace stretch
