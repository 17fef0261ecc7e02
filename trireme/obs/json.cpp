#include "trireme/obs/json.h"

#include <cmath>
#include <cstdio>

namespace trireme::obs {
namespace {

constexpr const char* kReplacement = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

// The length (2 to 4) of the well-formed UTF-8 sequence that starts at text[i], a byte of
// 0x80 or above; 0 when there is none: a stray continuation byte, a cut sequence, an
// overlong form, a surrogate or a code point above U+10FFFF (Latin-1 text, say).
size_t utf8_sequence(const std::string& text, size_t i) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  size_t n = 0;
  unsigned char low = 0x80, high = 0xBF;  // the second byte's range
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) low = 0xA0;   // else overlong (below U+0800)
    if (c == 0xED) high = 0x9F;  // else a surrogate (U+D800..U+DFFF)
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) low = 0x90;   // else overlong (below U+10000)
    if (c == 0xF4) high = 0x8F;  // else above U+10FFFF
  }
  if (n == 0 || i + n > text.size() || byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (size_t k = 2; k < n; ++k)
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
  return n;
}

// Whether the n-byte sequence at text[i] is U+FFFE or U+FFFF (EF BF BE/BF), which JSON
// carries but XML 1.0 does not allow in a document.
bool noncharacter_ffff(const std::string& text, size_t i, size_t n) {
  return n == 3 && static_cast<unsigned char>(text[i]) == 0xEF && static_cast<unsigned char>(text[i + 1]) == 0xBF &&
         static_cast<unsigned char>(text[i + 2]) >= 0xBE;
}

}  // namespace

std::string json_escape(const std::string& text) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = text[i];
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else if (c < 0x80) {
          out += static_cast<char>(c);
        } else if (const size_t n = utf8_sequence(text, i)) {
          out.append(text, i, n);
          i += n - 1;
        } else {
          out += kReplacement;
        }
    }
  }
  return out + "\"";
}

std::string xml_escape(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    // XML 1.0 allows no control characters but tab, newline and carriage return.
    else if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') out += kReplacement;
    else if (static_cast<unsigned char>(c) < 0x80) out += c;
    else if (const size_t n = utf8_sequence(text, i); n && !noncharacter_ffff(text, i, n)) {
      out.append(text, i, n);
      i += n - 1;
    } else {
      out += kReplacement;
      if (n) i += n - 1;
    }
  }
  return out;
}

std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";  // JSON has no NaN/Inf
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.10g", value);
  return buf;
}

JsonObject& JsonObject::add(const std::string& key, double value) {
  fields_.emplace_back(key, json_number(value));
  return *this;
}
JsonObject& JsonObject::add(const std::string& key, int64_t value) {
  fields_.emplace_back(key, std::to_string(value));
  return *this;
}
JsonObject& JsonObject::add(const std::string& key, const std::string& value) {
  fields_.emplace_back(key, json_escape(value));
  return *this;
}
JsonObject& JsonObject::add(const std::string& key, bool value) {
  fields_.emplace_back(key, value ? "true" : "false");
  return *this;
}
JsonObject& JsonObject::add_raw(const std::string& key, std::string json) {
  fields_.emplace_back(key, std::move(json));
  return *this;
}

std::string JsonObject::str() const {
  std::string out = "{";
  for (size_t i = 0; i < fields_.size(); ++i) {
    if (i) out += ", ";
    out += json_escape(fields_[i].first) + ": " + fields_[i].second;
  }
  return out + "}";
}

}  // namespace trireme::obs
