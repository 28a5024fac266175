// Which JSON Schemas structured output enforces (json_schema_support.h). The rules follow
// xgrammar 0.2.8's json_schema_converter.cc: its parser reads one branch of a schema object —
// the first of $ref, const, enum, anyOf, oneOf and allOf, else its type — and ignores the
// keywords of the others; it compiles in strict mode (no properties or items the schema does
// not describe), which only narrows what a reply may hold.
#include "json_schema_support.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <regex>
#include <set>
#include <vector>

#include "openai_request.h"  // ApiError

namespace granule::server {
namespace {

using ojson = nlohmann::ordered_json;
using Pointer = ojson::json_pointer;

enum class Kind {
  Annotation,   // constrains nothing
  Container,    // $defs: schemas checked where a $ref uses them
  Numeric,      // constrains numbers only
  String,       // constrains strings only
  Array,        // constrains arrays only
  Object,       // constrains objects only
  Branch,       // the converter reads this keyword alone (see the file's comment)
  NotEnforced,  // a keyword the converter ignores wherever it sits
  Unknown,
};

Kind keyword_kind(const std::string& k) {
  static const std::vector<std::pair<const char*, Kind>> kTable = {
      {"$schema", Kind::Annotation},
      {"$comment", Kind::Annotation},
      {"title", Kind::Annotation},
      {"description", Kind::Annotation},
      {"default", Kind::Annotation},
      {"examples", Kind::Annotation},
      {"deprecated", Kind::Annotation},
      {"readOnly", Kind::Annotation},
      {"writeOnly", Kind::Annotation},
      // Names for $dynamicRef and "#name" references, which are refused; alone they do nothing.
      {"$anchor", Kind::Annotation},
      {"$dynamicAnchor", Kind::Annotation},
      {"$id", Kind::Annotation},  // only at the root (checked apart)
      {"$defs", Kind::Container},
      {"definitions", Kind::Container},
      {"minimum", Kind::Numeric},
      {"maximum", Kind::Numeric},
      {"exclusiveMinimum", Kind::Numeric},
      {"exclusiveMaximum", Kind::Numeric},
      {"multipleOf", Kind::Numeric},
      {"minLength", Kind::String},
      {"maxLength", Kind::String},
      {"pattern", Kind::String},
      {"format", Kind::String},
      {"contentEncoding", Kind::String},
      {"contentMediaType", Kind::String},
      {"contentSchema", Kind::String},
      {"items", Kind::Array},
      {"prefixItems", Kind::Array},
      {"minItems", Kind::Array},
      {"maxItems", Kind::Array},
      {"uniqueItems", Kind::Array},
      {"contains", Kind::Array},
      {"minContains", Kind::Array},
      {"maxContains", Kind::Array},
      {"unevaluatedItems", Kind::Array},
      {"properties", Kind::Object},
      {"required", Kind::Object},
      {"additionalProperties", Kind::Object},
      {"patternProperties", Kind::Object},
      {"propertyNames", Kind::Object},
      {"minProperties", Kind::Object},
      {"maxProperties", Kind::Object},
      {"dependentRequired", Kind::Object},
      {"dependentSchemas", Kind::Object},
      {"unevaluatedProperties", Kind::Object},
      {"$ref", Kind::Branch},
      {"const", Kind::Branch},
      {"enum", Kind::Branch},
      {"anyOf", Kind::Branch},
      {"oneOf", Kind::Branch},
      {"allOf", Kind::Branch},
      {"type", Kind::Annotation},  // read apart
      {"not", Kind::NotEnforced},
      {"if", Kind::NotEnforced},
      {"then", Kind::NotEnforced},
      {"else", Kind::NotEnforced},
      {"$dynamicRef", Kind::NotEnforced},
      {"$recursiveRef", Kind::NotEnforced},
      {"$recursiveAnchor", Kind::NotEnforced},
      {"$vocabulary", Kind::NotEnforced},
      {"dependencies", Kind::NotEnforced}};
  for (const auto& [name, kind] : kTable)
    if (k == name) return kind;
  return Kind::Unknown;
}

// The formats the converter turns into a regular expression. json-pointer and
// relative-json-pointer are left out: theirs lets a raw quote or backslash into the string.
bool enforced_format(const std::string& f) {
  static const char* const kFormats[] = {"date-time", "date",     "time",          "duration",
                                         "email",     "hostname", "ipv4",          "ipv6",
                                         "uuid",      "uri",      "uri-reference", "uri-template"};
  for (const char* known : kFormats)
    if (f == known) return true;
  return false;
}

const char* const kTypes[] = {"null", "boolean", "object", "array", "number", "string", "integer"};

bool known_type(const std::string& t) {
  for (const char* known : kTypes)
    if (t == known) return true;
  return false;
}

// --- oneOf: the converter keeps a oneOf exact only when it proves its branches disjoint ------
// (a shared discriminator property with distinct const/enum values, or branches that are bare
// types or const/enum values that cannot overlap); otherwise it reads it as anyOf.

bool xgrammar_annotation(const std::string& k) {
  return k == "title" || k == "default" || k == "description" || k == "examples" ||
         k == "deprecated" || k == "readOnly" || k == "writeOnly" || k == "$comment" ||
         k == "$schema";
}

bool may_overlap(const ojson& a, const ojson& b) {
  if (a.is_number() || b.is_number()) {
    if (!a.is_number() || !b.is_number()) return false;
    if (!a.is_number_float() && !b.is_number_float()) return a == b;
    return true;
  }
  if (a.is_null() || b.is_null()) return a.is_null() && b.is_null();
  if (a.is_boolean() || b.is_boolean()) return a.is_boolean() && b.is_boolean() && a == b;
  if (a.is_string() || b.is_string()) return a.is_string() && b.is_string() && a == b;
  if (a.is_array() || b.is_array()) {
    if (!a.is_array() || !b.is_array() || a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!may_overlap(a[i], b[i])) return false;
    return true;
  }
  if (!a.is_object() || !b.is_object() || a.size() != b.size()) return false;
  for (const auto& [key, value] : a.items()) {
    const auto it = b.find(key);
    if (it == b.end() || !may_overlap(value, *it)) return false;
  }
  return true;
}

bool value_has_type(const ojson& v, const std::string& t) {
  if (t == "null") return v.is_null();
  if (t == "boolean") return v.is_boolean();
  if (t == "string") return v.is_string();
  if (t == "integer")
    return v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                     std::floor(v.get<double>()) == v.get<double>());
  if (t == "number") return v.is_number();
  if (t == "array") return v.is_array();
  return t == "object" && v.is_object();
}

std::optional<std::vector<ojson>> finite_values(const ojson& s) {
  if (s.contains("const")) return std::vector<ojson>{s["const"]};
  if (s.contains("enum")) {
    if (!s["enum"].is_array() || s["enum"].empty()) return std::nullopt;
    return std::vector<ojson>(s["enum"].begin(), s["enum"].end());
  }
  return std::nullopt;
}

bool values_overlap(const std::vector<ojson>& a, const std::vector<ojson>& b) {
  for (const ojson& x : a)
    for (const ojson& y : b)
      if (may_overlap(x, y)) return true;
  return false;
}

bool has_branch_keyword(const ojson& s) {
  return s.contains("$ref") || s.contains("anyOf") || s.contains("allOf") || s.contains("oneOf");
}

std::optional<std::vector<ojson>> discriminator_values(const ojson& option,
                                                       const std::string& key) {
  if (!option.is_object() || has_branch_keyword(option)) return std::nullopt;
  if (option.value("type", ojson()) != "object") return std::nullopt;
  const auto required = option.find("required");
  if (required == option.end() || !required->is_array()) return std::nullopt;
  bool requires_key = false;
  for (const ojson& name : *required) {
    if (!name.is_string()) return std::nullopt;
    if (name == key) requires_key = true;
  }
  const auto props = option.find("properties");
  if (!requires_key || props == option.end() || !props->is_object()) return std::nullopt;
  const auto prop = props->find(key);
  if (prop == props->end() || !prop->is_object()) return std::nullopt;
  return finite_values(*prop);
}

bool disjoint_by_discriminator(const ojson& options) {
  const ojson& first = options.front();
  if (!first.is_object() || !first.contains("required") || !first["required"].is_array() ||
      !first.contains("properties") || !first["properties"].is_object())
    return false;
  for (const ojson& name : first["required"]) {
    if (!name.is_string()) continue;
    std::vector<std::vector<ojson>> values;
    for (const ojson& option : options) {
      auto v = discriminator_values(option, name.get<std::string>());
      if (!v) break;
      values.push_back(std::move(*v));
    }
    if (values.size() != options.size()) continue;
    bool disjoint = true;
    for (size_t i = 0; i < values.size() && disjoint; ++i)
      for (size_t j = i + 1; j < values.size() && disjoint; ++j)
        disjoint = !values_overlap(values[i], values[j]);
    if (disjoint) return true;
  }
  return false;
}

struct ArmProof {
  std::set<std::string> types;  // a bare type (set), or
  std::vector<ojson> values;    // const/enum values
  bool finite = false;
};

std::optional<ArmProof> classify_arm(const ojson& option) {
  if (!option.is_object() || has_branch_keyword(option)) return std::nullopt;
  ArmProof proof;
  if (auto values = finite_values(option)) {
    proof.finite = true;
    proof.values = std::move(*values);
    return proof;
  }
  if (!option.contains("type")) return std::nullopt;
  for (const auto& [key, value] : option.items())
    if (key != "type" && !xgrammar_annotation(key)) return std::nullopt;
  const ojson& type = option["type"];
  if (type.is_string()) {
    proof.types.insert(type.get<std::string>());
  } else if (type.is_array() && !type.empty()) {
    for (const ojson& t : type) {
      if (!t.is_string()) return std::nullopt;
      proof.types.insert(t.get<std::string>());
    }
  } else {
    return std::nullopt;
  }
  for (const std::string& t : proof.types)
    if (!known_type(t) || t == "object") return std::nullopt;
  return proof;
}

bool types_overlap(const std::set<std::string>& a, const std::set<std::string>& b) {
  const auto numeric = [](const std::string& t) { return t == "integer" || t == "number"; };
  for (const std::string& x : a)
    for (const std::string& y : b)
      if (x == y || (numeric(x) && numeric(y))) return true;
  return false;
}

bool values_meet_types(const std::vector<ojson>& values, const std::set<std::string>& types) {
  for (const ojson& v : values) {
    if (v.is_number() && (types.count("integer") || types.count("number"))) return true;
    for (const std::string& t : types)
      if (value_has_type(v, t)) return true;
  }
  return false;
}

bool disjoint_by_type_or_value(const ojson& options) {
  std::vector<ArmProof> proofs;
  for (const ojson& option : options) {
    auto proof = classify_arm(option);
    if (!proof) return false;
    proofs.push_back(std::move(*proof));
  }
  for (size_t i = 0; i < proofs.size(); ++i) {
    for (size_t j = i + 1; j < proofs.size(); ++j) {
      const ArmProof& a = proofs[i];
      const ArmProof& b = proofs[j];
      const bool overlap = a.finite && b.finite ? values_overlap(a.values, b.values)
                           : a.finite           ? values_meet_types(a.values, b.types)
                           : b.finite           ? values_meet_types(b.values, a.types)
                                                : types_overlap(a.types, b.types);
      if (overlap) return false;
    }
  }
  return true;
}

// --- the walk ---------------------------------------------------------------------------------

class Walker {
 public:
  Walker(const ojson& root, std::string param, bool allow_rewrite)
      : root_(root), param_(std::move(param)), allow_rewrite_(allow_rewrite) {}

  ojson run() {
    walk(root_, Pointer(), param_, std::nullopt);
    ojson out = root_;
    for (const auto& [at, types] : typed_) out[Pointer(at)]["type"] = types;
    return out;
  }

 private:
  [[noreturn]] void refuse(const std::string& name, const std::string& message) const {
    throw ApiError(400, message, "invalid_request_error", name);
  }
  [[noreturn]] void not_enforced(const std::string& key, const std::string& name,
                                 const std::string& why = "leave it out") const {
    refuse(name, "the JSON Schema keyword '" + key + "' (in '" + name +
                     "') is not supported for structured output: " + why);
  }

  void walk(const ojson& s, const Pointer& at, const std::string& name,
            const std::optional<std::string>& default_type) {
    if (s.is_boolean()) {
      if (!s.get<bool>())
        refuse(name, "'" + name +
                         "' is the schema false, which no value satisfies: structured output "
                         "takes false only as 'items', 'additionalProperties' or "
                         "'unevaluated*'");
      return;
    }
    if (!s.is_object())
      refuse(name, "'" + name + "' must be a JSON Schema (an object or a boolean)");
    if (!visited_.insert(at.to_string()).second) return;  // a $ref cycle, or seen already
    // The walk and the converter recurse once per level: a deep schema would end the process.
    constexpr int kMaxDepth = 64;
    if (depth_ >= kMaxDepth)
      refuse(name, "'" + name + "' nests schemas more than " + std::to_string(kMaxDepth) +
                       " deep, more than structured output takes");
    struct Deeper {
      int& depth;
      explicit Deeper(int& d) : depth(++d) {}
      ~Deeper() { --depth; }
    } deeper(depth_);

    std::string branch;
    for (const auto& [key, value] : s.items()) {
      const Kind kind = keyword_kind(key);
      if (kind == Kind::Unknown || kind == Kind::NotEnforced) not_enforced(key, name);
      if (key == "$id" && !at.empty())
        not_enforced(key, name, "an '$id' below the root would move where '$ref's point");
      if (kind == Kind::Container && !value.is_object())
        refuse(name, "'" + name + "." + key + "' must be an object of schemas");
      if (kind == Kind::Branch && branch.empty()) branch = key;
    }
    if (!branch.empty()) return walk_branch(s, at, name, branch);

    std::set<std::string> types;
    std::vector<std::string> constraining;
    for (const auto& [key, value] : s.items()) {
      const Kind kind = keyword_kind(key);
      if (kind == Kind::Numeric || kind == Kind::String || kind == Kind::Array ||
          kind == Kind::Object)
        constraining.push_back(key);
    }
    if (const auto it = s.find("type"); it != s.end()) {
      std::vector<ojson> listed =
          it->is_array() ? std::vector<ojson>(it->begin(), it->end()) : std::vector<ojson>{*it};
      if (listed.empty())
        refuse(name, "'" + name + ".type' must name a type or a non-empty array of types");
      for (const ojson& t : listed) {
        if (!t.is_string() || !known_type(t.get<std::string>()))
          refuse(name, "'" + name +
                           ".type' must be one of null, boolean, object, array, "
                           "number, string and integer, not " +
                           t.dump());
        types.insert(t.get<std::string>());
      }
    } else if (default_type) {
      types.insert(*default_type);
    } else if (s.contains("properties") || s.contains("additionalProperties") ||
               s.contains("unevaluatedProperties")) {
      types.insert("object");  // the converter makes it an object: narrower, still valid
    } else if (s.contains("items") || s.contains("prefixItems") || s.contains("unevaluatedItems")) {
      types.insert("array");
    } else if (constraining.empty()) {
      return;  // any value
    } else if (!allow_rewrite_) {
      not_enforced(constraining.front(), name,
                   "without a 'type' it is not enforced; give the schema a 'type'");
    } else {
      // Every type, each read with the schema's keywords for it, as JSON Schema means them.
      // Strict mode leaves no array with minItems > 0 and no object with minProperties > 0
      // here (they would have no items or properties to hold): those types are left out.
      ojson listed = ojson::array();
      for (const char* t : {"null", "boolean", "number", "string", "array", "object"}) {
        if (std::string(t) == "array" && (positive(s, "minItems") || positive(s, "minContains")))
          continue;
        if (std::string(t) == "object" && positive(s, "minProperties") &&
            !s.contains("patternProperties") && !s.contains("propertyNames"))
          continue;
        listed.push_back(t);
        types.insert(t);
      }
      typed_.emplace_back(at.to_string(), listed);
    }
    for (const std::string& t : types) {
      if (t == "integer" || t == "number") numeric(s, name, t == "integer");
      if (t == "string") string(s, name);
      if (t == "array") array(s, at, name);
      if (t == "object") object(s, at, name);
    }
  }

  void walk_branch(const ojson& s, const Pointer& at, const std::string& name,
                   const std::string& branch) {
    const ojson& value = s[branch];
    for (const auto& [key, v] : s.items()) {
      if (key == branch) continue;
      if (key == "type" && (branch == "const" || branch == "enum")) {
        // The reply is one of the values: each must be of the type.
        std::vector<ojson> values{value};
        if (branch == "enum")
          values = value.is_array() ? std::vector<ojson>(value.begin(), value.end())
                                    : std::vector<ojson>{};
        for (const ojson& x : values) {
          bool matches = false;
          for (const ojson& t : v.is_array() ? v : ojson::array({v}))
            matches = matches || (t.is_string() && value_has_type(x, t.get<std::string>()));
          if (!matches)
            refuse(name, "'" + name + "." + branch + "' holds " + x.dump() +
                             ", which is not of the schema's 'type'");
        }
        continue;
      }
      const Kind kind = keyword_kind(key);
      if (key != "type" && (kind == Kind::Annotation || kind == Kind::Container)) continue;
      not_enforced(key, name,
                   "beside '" + branch + "' it is not enforced (only '" + branch +
                       "' is read there); move it into the schema" +
                       (branch == "$ref" ? " '$ref' points at" : "s of '" + branch + "'"));
    }
    if (branch == "$ref") return ref(value, name);
    if (branch == "const") return;
    if (branch == "enum") {
      if (!value.is_array() || value.empty())
        refuse(name, "'" + name + ".enum' must be a non-empty array");
      return;
    }
    if (!value.is_array() || value.empty())
      refuse(name, "'" + name + "." + branch + "' must be a non-empty array of schemas");
    if (branch == "allOf" && value.size() != 1)
      not_enforced(branch, name,
                   "an allOf of " + std::to_string(value.size()) +
                       " schemas is not enforced (one is); merge them into one schema");
    for (size_t i = 0; i < value.size(); ++i)
      walk(value[i], at / branch / i, name + "." + branch + "[" + std::to_string(i) + "]",
           std::nullopt);
    if (branch == "oneOf" && !disjoint_by_discriminator(value) && !disjoint_by_type_or_value(value))
      not_enforced(branch, name,
                   "its schemas may overlap, and a reply matching two would break it; use "
                   "'anyOf', or tell them apart by a required property with distinct 'const' "
                   "values");
  }

  void ref(const ojson& value, const std::string& name) {
    if (!value.is_string()) refuse(name, "'" + name + ".$ref' must be a string");
    const std::string uri = value.get<std::string>();
    const auto outside = [&] {
      refuse(name, "'" + name +
                       ".$ref' must point into the schema itself (\"#\" or \"#/...\"): "
                       "other documents and anchors are not resolved");
    };
    if (uri == "#") return walk(root_, Pointer(), param_, std::nullopt);
    if (!uri.starts_with("#/")) outside();
    // The converter looks each part up as an object key, unescaped: a part with ~ or % escapes
    // (or an array index) would point elsewhere for it.
    Pointer at;
    const ojson* current = &root_;
    size_t start = 2;
    while (start <= uri.size()) {
      size_t end = uri.find('/', start);
      if (end == std::string::npos) end = uri.size();
      const std::string part = uri.substr(start, end - start);
      if (part.empty() || part.find_first_of("~%") != std::string::npos)
        refuse(name, "'" + name + ".$ref' (" + uri +
                         ") must be a plain path of property names, without escapes");
      if (!current->is_object() || !current->contains(part))
        refuse(name, "'" + name + ".$ref' (" + uri + ") points at nothing in the schema");
      current = &(*current)[part];
      at /= part;
      start = end + 1;
    }
    walk(*current, at, param_ + ".$ref(" + uri + ")", std::nullopt);
  }

  // A whole number the converter reads as a 64-bit integer.
  static bool whole(const ojson& v) {
    if (v.is_number_unsigned()) return v.get<uint64_t>() <= (uint64_t{1} << 62);
    return v.is_number_integer() ||
           (v.is_number_float() && std::isfinite(v.get<double>()) &&
            std::floor(v.get<double>()) == v.get<double>() && std::fabs(v.get<double>()) < 4.0e18);
  }
  static bool positive(const ojson& s, const char* key) {
    const auto it = s.find(key);
    return it != s.end() && it->is_number() && it->get<double>() > 0;
  }

  void count(const ojson& s, const char* key, const std::string& name) {
    if (const auto it = s.find(key);
        it != s.end() && !(it->is_number_integer() && it->get<int64_t>() >= 0))
      refuse(name, "'" + name + "." + key + "' must be a non-negative integer");
  }

  void numeric(const ojson& s, const std::string& name, bool integer) {
    std::optional<double> low, high;
    for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      const auto it = s.find(key);
      if (it == s.end()) continue;
      if (!it->is_number()) refuse(name, "'" + name + "." + key + "' must be a number");
      if (integer && !whole(*it))
        refuse(name, "'" + name + "." + key +
                         "' must be a whole number for an integer: structured output takes "
                         "integer bounds only");
      const double v = it->get<double>();
      const std::string k = key;
      const bool lower = k == "minimum" || k == "exclusiveMinimum";
      const bool exclusive = k.starts_with("exclusive");
      const double bound = !integer || !exclusive ? v : (lower ? v + 1 : v - 1);
      if (lower)
        low = low ? std::max(*low, bound) : bound;
      else
        high = high ? std::min(*high, bound) : bound;
    }
    const auto it = s.find("multipleOf");
    if (it == s.end()) return;
    if (!integer)
      not_enforced("multipleOf", name,
                   "it is enforced for integers (\"type\": \"integer\"), not for numbers");
    if (!whole(*it) || it->get<double>() < 1 || it->get<double>() > 1024)
      not_enforced("multipleOf", name, "it is enforced as a whole number from 1 to 1024");
    if (low.has_value() != high.has_value() || (low && *high - *low > 9999))
      not_enforced("multipleOf", name,
                   "it is enforced with no bounds, or with both at most 10000 values apart");
  }

  void string(const ojson& s, const std::string& name) {
    for (const char* key : {"contentEncoding", "contentMediaType", "contentSchema"})
      if (s.contains(key)) not_enforced(key, name);
    count(s, "minLength", name);
    count(s, "maxLength", name);
    const char* shape = nullptr;  // what decides the string's form, which drops the others
    if (const auto f = s.find("format"); f != s.end()) {
      if (!f->is_string() || !enforced_format(f->get<std::string>()))
        not_enforced("format", name,
                     "the format " + f->dump() +
                         " is not enforced (these are: date-time, date, time, duration, email, "
                         "hostname, ipv4, ipv6, uuid, uri, uri-reference, uri-template)");
      shape = "format";
    } else if (const auto p = s.find("pattern"); p != s.end()) {
      if (!p->is_string()) refuse(name, "'" + name + ".pattern' must be a string");
      shape = "pattern";
    }
    if (!shape) return;
    for (const char* key : {"pattern", "minLength", "maxLength"})
      if (key != std::string(shape) && s.contains(key))
        not_enforced(key, name,
                     std::string("beside '") + shape + "' it is not enforced; fold it into a " +
                         "'pattern'");
  }

  void array(const ojson& s, const Pointer& at, const std::string& name) {
    if (s.contains("contains")) not_enforced("contains", name);
    count(s, "minItems", name);
    count(s, "maxItems", name);
    if (const auto u = s.find("uniqueItems"); u != s.end() && *u != false) {
      const auto max = s.find("maxItems");
      if (*u != true || max == s.end() || !max->is_number_integer() || max->get<int64_t>() > 1)
        not_enforced("uniqueItems", name, "leave it out, or allow at most one item");
    }
    if (const auto it = s.find("prefixItems"); it != s.end()) {
      if (!it->is_array()) refuse(name, "'" + name + ".prefixItems' must be an array of schemas");
      for (size_t i = 0; i < it->size(); ++i)
        walk((*it)[i], at / "prefixItems" / i, name + ".prefixItems[" + std::to_string(i) + "]",
             std::nullopt);
    }
    const char* rest = s.contains("items")              ? "items"
                       : s.contains("unevaluatedItems") ? "unevaluatedItems"
                                                        : nullptr;
    if (rest) {
      const ojson& v = s[rest];
      if (!v.is_boolean() && !v.is_object())
        refuse(name, "'" + name + "." + rest + "' must be a schema or a boolean");
      if (v.is_object()) walk(v, at / rest, name + "." + rest, std::nullopt);
    }
  }

  void object(const ojson& s, const Pointer& at, const std::string& name) {
    for (const char* key : {"dependentRequired", "dependentSchemas"})
      if (s.contains(key)) not_enforced(key, name);
    count(s, "minProperties", name);
    count(s, "maxProperties", name);
    const auto props = s.find("properties");
    if (props != s.end()) {
      if (!props->is_object())
        refuse(name, "'" + name + ".properties' must be an object of schemas");
      for (const auto& [key, sub] : props->items())
        walk(sub, at / "properties" / key, name + ".properties." + key, std::nullopt);
    }
    if (const auto it = s.find("required"); it != s.end()) {
      if (!it->is_array()) refuse(name, "'" + name + ".required' must be an array of names");
      // The converter enforces a required property only when `properties` gives it a schema.
      for (const ojson& key : *it)
        if (!key.is_string() || props == s.end() || !props->contains(key.get<std::string>()))
          refuse(name, "'" + name + ".required' names " + key.dump() +
                           ", which 'properties' does not describe: give it a schema there");
    }
    // What holds the properties 'properties' does not name: additionalProperties, else
    // unevaluatedProperties (the same here, with no applicator beside them).
    const char* rest = s.contains("additionalProperties")    ? "additionalProperties"
                       : s.contains("unevaluatedProperties") ? "unevaluatedProperties"
                                                             : nullptr;
    const bool rest_false = rest && s[rest] == false;
    if (rest) {
      const ojson& v = s[rest];
      if (!v.is_boolean() && !v.is_object())
        refuse(name, "'" + name + "." + rest + "' must be a schema or a boolean");
      if (v.is_object()) walk(v, at / rest, name + "." + rest, std::nullopt);
    }
    // The grammar counts the properties it writes, and a name it makes up may come twice (a
    // JSON parser keeps one): minProperties holds only where required names meet it, or where
    // every name is one of 'properties' (each written once).
    const bool made_up_names =
        s.contains("patternProperties") || s.contains("propertyNames") || (rest && !rest_false);
    if (const auto min = s.find("minProperties");
        min != s.end() && made_up_names &&
        min->get<int64_t>() > static_cast<int64_t>(s.value("required", ojson::array()).size()))
      not_enforced("minProperties", name,
                   "beyond the required properties it is enforced only with "
                   "'additionalProperties': false (a reply may repeat a name it makes up)");
    if (const auto pp = s.find("patternProperties"); pp != s.end()) {
      if (!pp->is_object())
        refuse(name, "'" + name + ".patternProperties' must be an object of schemas");
      if (pp->size() > 1)
        not_enforced("patternProperties", name,
                     "more than one pattern is not enforced (a name matching two would need "
                     "both schemas)");
      if (rest && !rest_false)
        not_enforced(rest, name, "beside 'patternProperties' only false is enforced");
      if (s.contains("propertyNames"))
        not_enforced("propertyNames", name, "beside 'patternProperties' it is not enforced");
      for (const auto& [pattern, sub] : pp->items()) {
        if (props != s.end()) {
          // A named property whose name matches would need both schemas.
          std::regex re;
          try {
            re = std::regex(pattern, std::regex::ECMAScript);
          } catch (const std::regex_error&) {
            refuse(name, "'" + name + ".patternProperties' holds the pattern \"" + pattern +
                             "\", which is not a regular expression this server can check");
          }
          for (const auto& [key, unused] : props->items())
            if (std::regex_search(key, re))
              not_enforced("patternProperties", name,
                           "the property '" + key + "' also matches \"" + pattern +
                               "\", which is not enforced");
        }
        walk(sub, at / "patternProperties" / pattern, name + ".patternProperties." + pattern,
             std::nullopt);
      }
    }
    if (const auto pn = s.find("propertyNames"); pn != s.end()) {
      if (!pn->is_object())
        not_enforced("propertyNames", name, "it is enforced as a schema object, not a boolean");
      if (props != s.end() && !props->empty())
        not_enforced("propertyNames", name,
                     "beside 'properties' it is not enforced on their names");
      if (rest_false)
        not_enforced("propertyNames", name,
                     "beside '" + std::string(rest) + "': false it is not enforced");
      walk(*pn, at / "propertyNames", name + ".propertyNames", std::string("string"));
    }
  }

  const ojson& root_;
  std::string param_;
  bool allow_rewrite_;
  std::set<std::string> visited_;                     // schema objects walked, as pointers
  int depth_ = 0;                                     // of the one being walked
  std::vector<std::pair<std::string, ojson>> typed_;  // where "type" is added, and which
};

}  // namespace

nlohmann::ordered_json enforceable_json_schema(const nlohmann::ordered_json& schema,
                                               const std::string& param, bool allow_rewrite) {
  if (!schema.is_object() && !schema.is_boolean())
    throw ApiError(400, "'" + param + "' must be a JSON Schema (an object)",
                   "invalid_request_error", param);
  return Walker(schema, param, allow_rewrite).run();
}

}  // namespace granule::server
