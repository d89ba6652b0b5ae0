/* The REPL of the `remat` command: reads lines (readline with history and completion
 * on a terminal; plain lines from a pipe), evaluates them ("return " .. line first, so
 * expressions print), prints results readably, survives errors, and times lines on
 * request (:time). This is the command, not the library: it may print, and it keeps
 * the state completion needs in file statics (there is one REPL per process). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <lua.h>
#include <lauxlib.h>
#include <lualib.h>
#include <readline/history.h>
#include <readline/readline.h>

#include "../core/remat.h"

int rm_repl(lua_State *L);

/* Lua helpers of the REPL: `show(...)` turns results into text, `complete(text)`
 * lists completions of a dotted name. Both get the remat module as their argument. */
static const char *const HELPERS =
  "local remat = ...\n"
  "local function key_str(k)\n"
  "  if type(k) == 'string' and k:match('^[%a_][%w_]*$') then return k end\n"
  "  return '[' .. (type(k) == 'string' and string.format('%q', k) or tostring(k)) .. ']'\n"
  "end\n"
  "local function short(v)\n"
  "  if type(v) == 'string' then return string.format('%q', v) end\n"
  "  if remat.is_tensor and remat.is_tensor(v) then\n"
  "    if v:is_freed() then return '[remat.Tensor, freed]' end\n"
  "    local s = v:shape()\n"
  "    return '[' .. v:type() .. (#s == 0 and ' scalar' or ' of size ' .. table.concat(s, 'x')) .. ']'\n"
  "  end\n"
  "  if type(v) == 'table' then\n"
  "    local m = getmetatable(v)\n"
  "    if m and m.__tostring then return tostring(v) end\n"
  "    return next(v) == nil and '{}' or '{...}'\n"
  "  end\n"
  "  return tostring(v)\n"
  "end\n"
  "local function table_str(t)\n"
  "  local m = getmetatable(t)\n"
  "  if m and m.__tostring then return tostring(t) end\n"
  "  local parts, n, max = {}, #t, 30\n"
  "  for i = 1, math.min(n, max) do parts[#parts + 1] = short(t[i]) end\n"
  "  local keys = {}\n"
  "  for k in pairs(t) do\n"
  "    if not (math.type(k) == 'integer' and k >= 1 and k <= n) then keys[#keys + 1] = k end\n"
  "  end\n"
  "  table.sort(keys, function(a, b) return tostring(a) < tostring(b) end)\n"
  "  for _, k in ipairs(keys) do\n"
  "    if #parts >= max then break end\n"
  "    parts[#parts + 1] = key_str(k) .. ' = ' .. short(t[k])\n"
  "  end\n"
  "  local more = n + #keys - #parts\n"
  "  if more > 0 then parts[#parts + 1] = '... (' .. more .. ' more)' end\n"
  "  return '{' .. table.concat(parts, ', ') .. '}'\n"
  "end\n"
  "local function show(...)\n"
  "  local n = select('#', ...)\n"
  "  local out, multiline = {}, false\n"
  "  for i = 1, n do\n"
  "    local v = select(i, ...)\n"
  "    local s\n"
  "    if type(v) == 'table' then s = table_str(v) else s = tostring(v) end\n"
  "    if s:find('\\n') then multiline = true end\n"
  "    out[i] = s\n"
  "  end\n"
  "  return table.concat(out, multiline and '\\n' or '\\t')\n"
  "end\n"
  "local keywords = { 'and', 'break', 'do', 'else', 'elseif', 'end', 'false', 'for', 'function',\n"
  "  'goto', 'if', 'in', 'local', 'nil', 'not', 'or', 'repeat', 'return', 'then', 'true', 'until', 'while' }\n"
  "local function fields(v)\n"
  "  local seen, out = {}, {}\n"
  "  local function add(t)\n"
  "    for k, x in pairs(t) do\n"
  "      if type(k) == 'string' and k:match('^[%a_][%w_]*$') and not seen[k] then seen[k] = true; out[#out + 1] = k end\n"
  "    end\n"
  "  end\n"
  "  if remat.is_tensor and remat.is_tensor(v) then add(remat.Tensor); seen.grad = true; out[#out + 1] = 'grad'; return out end\n"
  "  if remat.nn and remat.nn.is_module and remat.nn.is_module(v) then add(remat.nn.Module); return out end\n"
  "  for _ = 1, 8 do\n"
  "    if type(v) == 'table' then add(v) elseif type(v) == 'string' then add(string) break else break end\n"
  "    local m = getmetatable(v)\n"
  "    v = m and type(m.__index) == 'table' and m.__index or nil\n"
  "    if v == nil then break end\n"
  "  end\n"
  "  return out\n"
  "end\n"
  "local function complete(text)\n"
  "  local head, sep, part = text:match('^(.*)([%.:])([%w_]*)$')\n"
  "  local cands, base = {}, _G\n"
  "  if head then\n"
  "    if not head:match('^[%a_][%w_]*([%.:][%a_][%w_]*)*$') and not head:match('^[%a_][%w_%.:]*$') then return cands end\n"
  "    for name in head:gmatch('[^%.:]+') do\n"
  "      if type(base) == 'table' then base = rawget(base, name)\n"
  "      elseif remat.is_tensor and remat.is_tensor(base) then base = name == 'grad' and base.grad or remat.Tensor[name]\n"
  "      elseif type(base) == 'userdata' then local ok, v = pcall(function() return base[name] end); base = ok and v or nil\n"
  "      else return cands end\n"
  "      if base == nil then return cands end\n"
  "    end\n"
  "    for _, k in ipairs(fields(base)) do\n"
  "      if k:sub(1, #part) == part then cands[#cands + 1] = head .. sep .. k end\n"
  "    end\n"
  "  else\n"
  "    for _, k in ipairs(fields(_G)) do if k:sub(1, #text) == text then cands[#cands + 1] = k end end\n"
  "    for _, k in ipairs(keywords) do if k:sub(1, #text) == text then cands[#cands + 1] = k end end\n"
  "  end\n"
  "  table.sort(cands)\n"
  "  return cands\n"
  "end\n"
  "return show, complete\n";

static lua_State *repl_L;          /* for completion and the interrupt handler */
static int show_ref = LUA_NOREF, complete_ref = LUA_NOREF;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Ctrl-C while a line runs: stop the Lua code at its next instruction, as lua.c does. */
static void stop_hook(lua_State *L, lua_Debug *ar) {
  lua_sethook(L, NULL, 0, 0);
  luaL_error(L, "interrupted");
}

static void on_sigint(int sig) {
  signal(sig, SIG_DFL);
  lua_sethook(repl_L, stop_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKLINE | LUA_MASKCOUNT, 1);
}

/* ---- completion ---- */

static char **matches;
static int n_matches, next_match;

static char *match_gen(const char *text, int state) {
  if (state == 0) next_match = 0;
  if (!matches || next_match >= n_matches) return NULL;
  return strdup(matches[next_match++]);
}

static void free_matches(void) {
  for (int i = 0; i < n_matches; i++) free(matches[i]);
  free(matches);
  matches = NULL;
  n_matches = 0;
}

static char **complete(const char *text, int start, int end) {
  lua_State *L = repl_L;
  rl_attempted_completion_over = 1;   /* no file-name completion */
  rl_completion_append_character = '\0';
  free_matches();
  int top = lua_gettop(L);
  lua_rawgeti(L, LUA_REGISTRYINDEX, complete_ref);
  lua_pushstring(L, text);
  if (lua_pcall(L, 1, 1, 0) == LUA_OK && lua_istable(L, -1)) {
    int n = (int)luaL_len(L, -1);
    matches = calloc((size_t)n + 1, sizeof *matches);
    for (int i = 1; matches && i <= n; i++) {
      lua_rawgeti(L, -1, i);
      const char *s = lua_tostring(L, -1);
      if (s) matches[n_matches++] = strdup(s);
      lua_pop(L, 1);
    }
  }
  lua_settop(L, top);
  return rl_completion_matches(text, match_gen);
}

/* ---- reading lines ---- */

static char *read_line(int tty, const char *prompt) {
  if (tty) return readline(prompt);
  size_t cap = 0;
  char *line = NULL;
  ssize_t n = getline(&line, &cap, stdin);
  if (n < 0) { free(line); return NULL; }
  if (n > 0 && line[n - 1] == '\n') line[n - 1] = 0;
  return line;
}

static const char *history_path(void) {
  static char path[1024];
  const char *home = getenv("HOME");
  if (!home || !*home) return NULL;
  snprintf(path, sizeof path, "%s/.remat_history", home);
  return path;
}

/* ---- evaluation ---- */

static int msgh(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (!msg) {
    if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) return 1;
    msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  }
  return 1;
}

/* Compiles the chunk: as an expression first ("return " .. code), else as statements.
 * Returns LUA_OK with the function pushed, LUA_ERRSYNTAX with the message pushed, or
 * -1 when the chunk is incomplete (more lines are needed). */
static int compile(lua_State *L, const char *code) {
  lua_pushfstring(L, "return %s;", code);
  int rc = luaL_loadbuffer(L, lua_tostring(L, -1), lua_rawlen(L, -1), "=stdin");
  lua_remove(L, -2);
  if (rc == LUA_OK) return LUA_OK;
  lua_pop(L, 1);
  rc = luaL_loadbuffer(L, code, strlen(code), "=stdin");
  if (rc == LUA_ERRSYNTAX) {
    size_t n;
    const char *msg = lua_tolstring(L, -1, &n);
    if (n >= 5 && !strcmp(msg + n - 5, "<eof>")) {
      lua_pop(L, 1);
      return -1;
    }
  }
  return rc;
}

/* Runs the function on top, prints its results; errors are printed, never raised. */
static void run(lua_State *L, int timing) {
  int base = lua_gettop(L);
  lua_pushcfunction(L, msgh);
  lua_insert(L, base);
  double t0 = now();
  signal(SIGINT, on_sigint);
  int rc = lua_pcall(L, 0, LUA_MULTRET, base);
  signal(SIGINT, SIG_DFL);
  double dt = now() - t0;
  if (rc != LUA_OK) {
    fprintf(stderr, "%s\n", lua_tostring(L, -1) ? lua_tostring(L, -1) : "(error)");
    fflush(stderr);
  } else if (lua_gettop(L) > base) {
    int n = lua_gettop(L) - base;
    lua_rawgeti(L, LUA_REGISTRYINDEX, show_ref);
    lua_insert(L, base + 1);
    if (lua_pcall(L, n, 1, base) == LUA_OK) printf("%s\n", lua_tostring(L, -1));
    else fprintf(stderr, "(cannot print the result: %s)\n", lua_tostring(L, -1));
  }
  if (timing) printf("-- %.6f s\n", dt);
  fflush(stdout);
  lua_settop(L, base - 1);
}

static const char *const HELP =
  ":help           this text\n"
  ":quit           leave (Ctrl-D and os.exit() too)\n"
  ":time           time every line from now on; :time on, :time off\n"
  ":time CODE      run CODE and print the time it took\n"
  ":complete TEXT  what Tab completes TEXT to (globals, fields, methods after ':')\n"
  "Other lines are Lua; an expression (or =expr) prints its values.\n";

/* Prints what Tab would complete text to, one per line. */
static void print_completions(lua_State *L, const char *text) {
  int top = lua_gettop(L);
  lua_rawgeti(L, LUA_REGISTRYINDEX, complete_ref);
  lua_pushstring(L, text);
  if (lua_pcall(L, 1, 1, 0) == LUA_OK && lua_istable(L, -1)) {
    lua_Integer n = luaL_len(L, -1);
    for (lua_Integer k = 1; k <= n; k++) {
      lua_rawgeti(L, -1, k);
      printf("%s\n", lua_tostring(L, -1));
      lua_pop(L, 1);
    }
  }
  fflush(stdout);
  lua_settop(L, top);
}

enum { CMD_NONE, CMD_DONE, CMD_QUIT, CMD_TIME_CODE };

/* A line starting with ':' (not a '::label::') is a command. *timing is the :time
 * setting; for ":time CODE" the code is moved to the start of line. */
static int command(lua_State *L, char *line, const char *s, int *timing) {
  if (s[0] != ':' || s[1] == ':') return CMD_NONE;
  const char *name = s + 1;
  size_t n = strcspn(name, " \t");
  const char *rest = name + n;
  while (*rest == ' ' || *rest == '\t') rest++;
#define IS(w) (n == strlen(w) && !strncmp(name, w, n))
  if (IS("quit") || IS("q")) return CMD_QUIT;
  if (IS("help") || IS("h")) {
    fputs(HELP, stdout);
  } else if (IS("time")) {
    if (*rest && strcmp(rest, "on") && strcmp(rest, "off")) {
      memmove(line, rest, strlen(rest) + 1);
      return CMD_TIME_CODE;
    }
    *timing = *rest ? !strcmp(rest, "on") : !*timing;
    printf("timing %s\n", *timing ? "on" : "off");
  } else if (IS("complete")) {
    print_completions(L, rest);
  } else {
    fprintf(stderr, "unknown command :%.*s (:help lists the commands)\n", (int)n, name);
    fflush(stderr);
  }
#undef IS
  fflush(stdout);
  return CMD_DONE;
}

/* Defines the globals remat, nn, optim, policy and loads the helpers. */
static int setup(lua_State *L) {
  lua_getglobal(L, "require");
  lua_pushliteral(L, "remat");
  lua_call(L, 1, 1);
  lua_pushvalue(L, -1);
  lua_setglobal(L, "remat");
  static const char *const parts[] = { "nn", "optim", "policy", NULL };
  for (int i = 0; parts[i]; i++) {
    lua_getfield(L, -1, parts[i]);
    lua_setglobal(L, parts[i]);
  }
  if (luaL_loadbuffer(L, HELPERS, strlen(HELPERS), "=[remat]/repl") != LUA_OK) return lua_error(L);
  lua_pushvalue(L, -2);
  lua_call(L, 1, 2);
  complete_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  show_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pop(L, 1);
  return 0;
}

/* The REPL: returns LUA_OK at end of input. */
int rm_repl(lua_State *L) {
  repl_L = L;
  int tty = isatty(STDIN_FILENO);
  lua_pushcfunction(L, setup);
  if (lua_pcall(L, 0, 0, 0) != LUA_OK) {
    fprintf(stderr, "remat: %s\n", lua_tostring(L, -1));
    return LUA_ERRRUN;
  }
  const char *hist = NULL;
  if (tty) {
    rl_readline_name = "remat";
    rl_attempted_completion_function = complete;
    rl_basic_word_break_characters = " \t\n\"\\'`@$><=;|&{(,)[]+-*/%^~#";
    rl_completer_word_break_characters = (char *)rl_basic_word_break_characters;
    hist = history_path();
    if (hist) {
      if (read_history(hist) != 0) write_history(hist);
      history_truncate_file(hist, 1000);
    }
    printf("remat %s (%s): remat, nn, optim and policy are loaded; :help lists the commands\n",
           REMAT_VERSION, LUA_RELEASE);
  }
  int timing = 0, time_once = 0;
  char *code = NULL;      /* the chunk being accumulated over lines */
  size_t code_n = 0;
  for (;;) {
    char *line = read_line(tty, tty ? (code ? ">> " : "> ") : NULL);
    if (!line) break;
    if (!code) {
      const char *s = line;
      while (*s == ' ' || *s == '\t') s++;
      int cmd = command(L, line, s, &timing);
      if (cmd == CMD_QUIT) { free(line); break; }
      if (cmd == CMD_DONE) { free(line); continue; }
      if (cmd == CMD_TIME_CODE) { time_once = 1; s = line; }
      if (!*s) { free(line); continue; }
      if (*s == '=') memmove(line, s + 1, strlen(s + 1) + 1);
    }
    size_t ln = strlen(line);
    char *grown = realloc(code, code_n + ln + 2);
    if (!grown) { free(line); break; }
    code = grown;
    if (code_n) code[code_n++] = '\n';
    memcpy(code + code_n, line, ln + 1);
    code_n += ln;
    free(line);
    int rc = compile(L, code);
    if (rc == -1) continue;  /* incomplete: read more lines */
    if (tty) {
      add_history(code);
      if (hist) append_history(1, hist);
    }
    if (rc == LUA_OK) {
      run(L, timing || time_once);
    } else {
      fprintf(stderr, "%s\n", lua_tostring(L, -1));
      fflush(stderr);
      lua_pop(L, 1);
    }
    free(code);
    code = NULL;
    code_n = 0;
    time_once = 0;
  }
  if (code) {  /* input ended inside an incomplete chunk: report its syntax error */
    luaL_loadbuffer(L, code, code_n, "=stdin");
    fprintf(stderr, "%s\n", lua_tostring(L, -1) ? lua_tostring(L, -1) : "incomplete input");
    lua_pop(L, 1);
    free(code);
  }
  free_matches();
  if (tty) printf("\n");
  return LUA_OK;
}
