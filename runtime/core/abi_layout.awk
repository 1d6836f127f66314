# abi_layout.awk — the rows of version.c's layout table, from the preprocessed WK_CDEF region of
# runtime/wick.h (the text the build turns into LuaJIT's cdef): for each `typedef struct { ... } Name;`
# a SIZE_OF(Name) row and an OFFSET_OF(Name, field) row per field, in declaration order. So every struct
# Lua sees is checked against the compiler, and a struct added to wick.h needs no line written here.
# A declaration this does not read (a nested struct, a function pointer) stops the build, naming it.
{ text = text " " $0 }
END {
  while ((start = index(text, "typedef struct {")) > 0) {
    text = substr(text, start + length("typedef struct {"))
    close_at = index(text, "}")
    body = substr(text, 1, close_at - 1)
    rest = substr(text, close_at + 1)
    if (!match(rest, /^[ \t]*[A-Za-z_][A-Za-z_0-9]*[ \t]*;/)) fail("a struct without a typedef name: " body)
    name = substr(rest, RSTART, RLENGTH)
    gsub(/[ \t;]/, "", name)
    if (index(body, "{") || index(body, "(")) fail(name ": a nested struct or a function pointer")
    print "    SIZE_OF(" name "),"
    count = split(body, declarations, ";")
    for (d = 1; d <= count; d++) {
      declaration = declarations[d]
      gsub(/\[[^]]*\]/, "", declaration)  # array sizes
      n = split(declaration, declarators, ",")
      for (k = 1; k <= n; k++) {
        if (!match(declarators[k], /[A-Za-z_][A-Za-z_0-9]*[ \t]*$/)) continue
        field = substr(declarators[k], RSTART, RLENGTH)
        gsub(/[ \t]/, "", field)
        print "    OFFSET_OF(" name ", " field "),"
      }
    }
    text = rest
  }
}
function fail(why) {
  print "abi_layout.awk: " why > "/dev/stderr"
  exit 1
}
