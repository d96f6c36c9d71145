#include "bagua/dataset_cache/value_codec.h"

#include <cstring>

namespace bagua::cache::codec {

namespace {

void putU64(std::string& out, uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) {
    b[i] = static_cast<char>(static_cast<uint8_t>(v >> (8 * i)));
  }
  out.append(b, 8);
}

// The bytes of `shape`'s elements, or false on overflow.
bool arrayBytes(const std::vector<uint64_t>& shape, size_t elem, uint64_t* out) {
  uint64_t n = elem;
  for (uint64_t d : shape) {
    if (d != 0 && n > UINT64_MAX / d) {
      return false;
    }
    n *= d;
  }
  *out = n;
  return true;
}

// RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF.
bool validUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const uint8_t c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0;
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
      cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (n - i < len) {
      return false;
    }
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) {
        return false;
      }
      cp = (cp << 6) | (p[i + k] & 0x3f);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (len == 4 && (cp < 0x10000 || cp > 0x10ffff))) {
      return false;
    }
    i += len;
  }
  return true;
}

class Reader {
 public:
  explicit Reader(std::string_view b) : b_(b) {}
  size_t left() const { return b_.size() - pos_; }
  bool u8(uint8_t* v) {
    if (left() < 1) {
      return false;
    }
    *v = static_cast<uint8_t>(b_[pos_++]);
    return true;
  }
  bool u64(uint64_t* v) {
    if (left() < 8) {
      return false;
    }
    uint64_t x = 0;
    for (int i = 0; i < 8; ++i) {
      x |= static_cast<uint64_t>(static_cast<uint8_t>(b_[pos_ + i])) << (8 * i);
    }
    pos_ += 8;
    *v = x;
    return true;
  }
  bool take(uint64_t n, std::string_view* out) {
    if (n > left()) {
      return false;
    }
    *out = b_.substr(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return true;
  }
  size_t pos() const { return pos_; }

 private:
  std::string_view b_;
  size_t pos_ = 0;
};

}  // namespace

size_t elemSize(uint8_t elem) {
  static constexpr size_t kSizes[] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8, 8, 16};
  return elem < sizeof(kSizes) / sizeof(kSizes[0]) ? kSizes[elem] : 0;
}

bool isTyped(std::string_view bytes) {
  return bytes.substr(0, kMagic.size()) == kMagic;
}

Result<std::string> encode(std::span<const Item> items) {
  std::string out(kMagic);
  uint64_t owed = 1;  // items the values opened so far still need
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& it = items[i];
    if (owed == 0) {
      return BAGUA_ERROR(kInvalidArgument, "item %zu follows a complete value", i);
    }
    --owed;
    out.push_back(static_cast<char>(it.tag));
    switch (it.tag) {
    case Tag::kNone:
    case Tag::kFalse:
    case Tag::kTrue:
      break;
    case Tag::kInt:
      putU64(out, static_cast<uint64_t>(it.integer));
      break;
    case Tag::kFloat: {
      uint64_t bits = 0;
      std::memcpy(&bits, &it.real, sizeof(bits));
      putU64(out, bits);
      break;
    }
    case Tag::kStr:
    case Tag::kBytes:
      if (it.tag == Tag::kStr && !validUtf8(it.data)) {
        return BAGUA_ERROR(kInvalidArgument, "item %zu: a string that is not UTF-8", i);
      }
      putU64(out, it.data.size());
      out.append(it.data);
      break;
    case Tag::kList:
    case Tag::kTuple:
    case Tag::kDict: {
      putU64(out, it.count);
      const uint64_t add = it.tag == Tag::kDict ? 2 * it.count : it.count;
      if ((it.tag == Tag::kDict && it.count > UINT64_MAX / 2) || add > items.size()) {
        return BAGUA_ERROR(kInvalidArgument, "item %zu: %llu elements but %zu items in all", i,
                           static_cast<unsigned long long>(it.count), items.size());
      }
      owed += add;
      break;
    }
    case Tag::kArray: {
      const size_t es = elemSize(it.elem);
      uint64_t need = 0;
      if (es == 0 || it.shape.size() > 255 || !arrayBytes(it.shape, es, &need) ||
          need != it.data.size()) {
        return BAGUA_ERROR(kInvalidArgument,
                           "item %zu: an array of element type %u, %zu dims and %zu bytes that "
                           "do not match",
                           i, it.elem, it.shape.size(), it.data.size());
      }
      out.push_back(static_cast<char>(it.elem));
      out.push_back(static_cast<char>(it.flavor));
      out.push_back(static_cast<char>(it.shape.size()));
      for (uint64_t d : it.shape) {
        putU64(out, d);
      }
      out.append(it.data);
      break;
    }
    default:
      return BAGUA_ERROR(kInvalidArgument, "item %zu: unknown tag %u", i,
                         static_cast<unsigned>(it.tag));
    }
  }
  if (owed != 0) {
    return BAGUA_ERROR(kInvalidArgument, "the items end %llu short of a complete value",
                       static_cast<unsigned long long>(owed));
  }
  return out;
}

Result<std::vector<Item>> decode(std::string_view bytes, const Limits& limits) {
  if (!isTyped(bytes)) {
    return BAGUA_ERROR(kInvalidArgument, "not a typed cache value (no %s header)", kMagic.data());
  }
  Reader r(bytes.substr(kMagic.size()));
  auto bad = [&](const char* what) {
    return BAGUA_ERROR(kInvalidArgument, "damaged typed value at byte %zu: %s",
                       r.pos() + kMagic.size(), what);
  };
  std::vector<Item> items;
  std::vector<uint64_t> open;  // per open container: items it still needs
  uint64_t owed = 1;           // at the top level
  while (owed > 0 || !open.empty()) {
    // Close the containers that are complete.
    while (!open.empty() && open.back() == 0) {
      open.pop_back();
    }
    if (open.empty() && owed == 0) {
      break;
    }
    if (open.empty()) {
      --owed;
    } else {
      --open.back();
    }
    if (items.size() >= limits.maxItems) {
      return bad("too many items");
    }
    uint8_t tag = 0;
    if (!r.u8(&tag)) {
      return bad("truncated");
    }
    Item it;
    it.tag = static_cast<Tag>(tag);
    switch (it.tag) {
    case Tag::kNone:
    case Tag::kFalse:
    case Tag::kTrue:
      break;
    case Tag::kInt: {
      uint64_t v = 0;
      if (!r.u64(&v)) {
        return bad("truncated integer");
      }
      it.integer = static_cast<int64_t>(v);
      break;
    }
    case Tag::kFloat: {
      uint64_t v = 0;
      if (!r.u64(&v)) {
        return bad("truncated float");
      }
      std::memcpy(&it.real, &v, sizeof(v));
      break;
    }
    case Tag::kStr:
    case Tag::kBytes: {
      uint64_t n = 0;
      if (!r.u64(&n) || !r.take(n, &it.data)) {
        return bad("truncated string");
      }
      if (it.tag == Tag::kStr && !validUtf8(it.data)) {
        return bad("a string that is not UTF-8");
      }
      break;
    }
    case Tag::kList:
    case Tag::kTuple:
    case Tag::kDict: {
      if (!r.u64(&it.count)) {
        return bad("truncated count");
      }
      // Every element takes at least its tag byte.
      const uint64_t need = it.tag == Tag::kDict ? 2 * it.count : it.count;
      if ((it.tag == Tag::kDict && it.count > UINT64_MAX / 2) || need > r.left()) {
        return bad("a count larger than the bytes left");
      }
      if (open.size() >= limits.maxDepth) {
        return bad("nested too deep");
      }
      open.push_back(need);
      break;
    }
    case Tag::kArray: {
      uint8_t dims = 0;
      if (!r.u8(&it.elem) || !r.u8(&it.flavor) || !r.u8(&dims)) {
        return bad("truncated array header");
      }
      if (elemSize(it.elem) == 0) {
        return bad("an unknown element type");
      }
      if (dims > limits.maxDims) {
        return bad("too many dimensions");
      }
      it.shape.resize(dims);
      for (uint64_t& d : it.shape) {
        if (!r.u64(&d)) {
          return bad("truncated array shape");
        }
      }
      uint64_t n = 0;
      if (!arrayBytes(it.shape, elemSize(it.elem), &n) || !r.take(n, &it.data)) {
        return bad("array data shorter than its shape");
      }
      break;
    }
    default:
      return bad("an unknown tag");
    }
    items.push_back(std::move(it));
  }
  if (r.left() != 0) {
    return bad("bytes after the value");
  }
  return items;
}

}  // namespace bagua::cache::codec
