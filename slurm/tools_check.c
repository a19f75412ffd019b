/*
 * tools_check: the SPANK plugin's reading of a tools list; see
 * tools_check.h. Runs in srun, sbatch or salloc, as the user who typed the
 * option: nothing here is privileged, and nothing is loaded (a library is
 * looked for, never opened by the loader, so none of its code runs).
 */
#include "tools_check.h"

#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tools_list.h"

/* The loader's cache, glibc's format since 2.32 ("new" format alone). */
#define CACHE_PATH "/etc/ld.so.cache"
#define CACHE_MAGIC "glibc-ld.so.cache1.1"
/* Its header: magic and version (20 bytes), nlibs, len_strings, flags and
 * padding, extension_offset, 3 unused words. */
#define CACHE_HEADER 48
/* An entry: flags, key, value, osversion (4 bytes each), hwcap (8). */
#define CACHE_ENTRY 24
/* No cache is this big; a bigger file is not read. */
#define CACHE_MAX (64u << 20)

int tools_list_valid(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n >= TOOLS_LIST_MAX)
		return 0;
	int item_len = 0;
	for (const char *p = s; *p; p++) {
		char c = *p;
		if (c == ',') {
			if (item_len == 0)
				return 0;
			item_len = 0;
			continue;
		}
		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
		      (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '/' ||
		      c == '-'))
			return 0;
		item_len++;
	}
	return item_len > 0;
}

/* Appends printf output to BUF (of SIZE), truncating. */
__attribute__((format(printf, 3, 4))) static void append(char *buf, size_t size, const char *fmt, ...)
{
	size_t len = strlen(buf);
	if (len + 1 >= size)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf + len, size - len, fmt, ap);
	va_end(ap);
}

/* The ELF identity a library must share with this process to be loaded in
 * it: class, byte order, machine. Read from the running executable, not
 * named: whatever machine this is, the tasks' is the same. */
struct elf_kind {
	unsigned char class, data;
	uint16_t machine;
	int known;
};

static int read_kind(int fd, struct elf_kind *k, uint16_t *type)
{
	unsigned char h[sizeof(Elf64_Ehdr)];
	ssize_t n = pread(fd, h, sizeof(h), 0);
	/* e_type and e_machine sit at the same offsets in both classes. */
	if (n < (ssize_t)sizeof(Elf32_Ehdr) || memcmp(h, ELFMAG, SELFMAG) != 0)
		return -1;
	k->class = h[EI_CLASS];
	k->data = h[EI_DATA];
	uint16_t t, m;
	memcpy(&t, h + offsetof(Elf32_Ehdr, e_type), 2);
	memcpy(&m, h + offsetof(Elf32_Ehdr, e_machine), 2);
	k->machine = m;
	k->known = 1;
	if (type)
		*type = t;
	return 0;
}

static const struct elf_kind *own_kind(void)
{
	static struct elf_kind k;
	if (!k.known) {
		int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
		if (fd >= 0) {
			if (read_kind(fd, &k, NULL) != 0)
				k.known = 0;
			close(fd);
		}
	}
	return k.known ? &k : NULL;
}

/* A file as the loader tells objects apart: one object per file, however
 * it is named. */
struct file_id {
	dev_t dev;
	ino_t ino;
};

/* Whether PATH is a shared object this process could load: 0 and its id in
 * ID (if not NULL), else -1 and why in WHY (of SIZE). A FIFO or a device is
 * never opened. */
static int usable_file(const char *path, struct file_id *id, char *why, size_t size)
{
	struct stat st;
	if (stat(path, &st) != 0) {
		snprintf(why, size, "%s", strerror(errno));
		return -1;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(why, size, "not a regular file");
		return -1;
	}
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0) {
		snprintf(why, size, "%s", strerror(errno));
		return -1;
	}
	struct elf_kind k = {0};
	uint16_t type = 0;
	int rc = read_kind(fd, &k, &type);
	close(fd);
	if (rc != 0) {
		snprintf(why, size, "not a shared library (no ELF header)");
		return -1;
	}
	if (type != ET_DYN) {
		snprintf(why, size, "not a shared library (ELF type %u)", type);
		return -1;
	}
	const struct elf_kind *own = own_kind();
	if (own && (k.class != own->class || k.data != own->data || k.machine != own->machine)) {
		snprintf(why, size, "a shared library for another kind of machine");
		return -1;
	}
	if (id) {
		id->dev = st.st_dev;
		id->ino = st.st_ino;
	}
	return 0;
}

/* Outcome of a search by name. */
enum found { FOUND, NOT_FOUND, UNKNOWN };

/* NAME in each directory the loader searches from here. The plugin's own
 * object asks (it has no RUNPATH, like the shim): LD_LIBRARY_PATH, then the
 * loader's default directories. */
static enum found in_search_dirs(const char *name, struct file_id *id)
{
	Dl_info info;
	void *h = NULL;
	if (dladdr((void *)&tools_check, &info) && info.dli_fname && info.dli_fname[0])
		h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
	/* Linked into an executable (xtask's test): the program's handle. */
	if (!h)
		h = dlopen(NULL, RTLD_LAZY);
	if (!h)
		return UNKNOWN;
	enum found r = UNKNOWN;
	Dl_serinfo size;
	Dl_serinfo *si = NULL;
	if (dlinfo(h, RTLD_DI_SERINFOSIZE, &size) == 0 && (si = malloc(size.dls_size)) &&
	    dlinfo(h, RTLD_DI_SERINFOSIZE, si) == 0 && dlinfo(h, RTLD_DI_SERINFO, si) == 0) {
		r = NOT_FOUND;
		for (unsigned i = 0; i < si->dls_cnt && r != FOUND; i++) {
			char path[4096], why[128];
			const char *dir = si->dls_serpath[i].dls_name;
			int n = snprintf(path, sizeof(path), "%s/%s", *dir ? dir : ".", name);
			if (n > 0 && (size_t)n < sizeof(path) &&
			    usable_file(path, id, why, sizeof(why)) == 0)
				r = FOUND;
		}
	}
	free(si);
	dlclose(h);
	return r;
}

static uint32_t u32_at(const unsigned char *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return v;
}

/* NAME in the loader's cache: an entry of that name whose file is usable. */
static enum found in_cache(const char *name, struct file_id *id)
{
	int fd = open(CACHE_PATH, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		/* No cache is no entry (a system without ldconfig); an
		 * unreadable one is unknown. */
		return errno == ENOENT ? NOT_FOUND : UNKNOWN;
	struct stat st;
	unsigned char *buf = NULL;
	enum found r = UNKNOWN;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < CACHE_HEADER ||
	    (uint64_t)st.st_size > CACHE_MAX || !(buf = malloc(st.st_size)))
		goto out;
	size_t len = st.st_size;
	for (size_t got = 0; got < len;) {
		ssize_t n = read(fd, buf + got, len - got);
		if (n <= 0)
			goto out;
		got += n;
	}
	if (memcmp(buf, CACHE_MAGIC, strlen(CACHE_MAGIC)) != 0)
		goto out;
	uint32_t nlibs = u32_at(buf + 20);
	if ((uint64_t)nlibs * CACHE_ENTRY > len - CACHE_HEADER)
		goto out;
	r = NOT_FOUND;
	for (uint32_t i = 0; i < nlibs && r != FOUND; i++) {
		const unsigned char *e = buf + CACHE_HEADER + (size_t)i * CACHE_ENTRY;
		/* Strings: offsets from the start of the file, NUL-terminated
		 * inside it. */
		uint32_t key = u32_at(e + 4), value = u32_at(e + 8);
		if (key >= len || value >= len || !memchr(buf + key, 0, len - key) ||
		    !memchr(buf + value, 0, len - value))
			continue;
		char why[128];
		if (strcmp((const char *)buf + key, name) == 0 &&
		    usable_file((const char *)buf + value, id, why, sizeof(why)) == 0)
			r = FOUND;
	}
out:
	free(buf);
	close(fd);
	return r;
}

/* The keyword ENTRY is, or NULL. */
static const struct tools_keyword *keyword(const char *entry)
{
	for (size_t i = 0; i < sizeof(TOOLS_KEYWORDS) / sizeof(TOOLS_KEYWORDS[0]); i++)
		if (strcmp(TOOLS_KEYWORDS[i].name, entry) == 0)
			return &TOOLS_KEYWORDS[i];
	return NULL;
}

/* What the entries so far hold: the layers (bits by number) and the
 * libraries found, with the entries that named them. */
struct seen {
	unsigned layers;
	struct file_id ids[TOOLS_LIST_MAX / 2];
	const char *by[TOOLS_LIST_MAX / 2];
	size_t n;
};

/* Whether the library ENTRY (loaded as LOAD_AS) is found, with its id; if
 * not, why in WHY. */
static int library_found(const char *entry, const char *load_as, int named, struct file_id *id,
			 char *why, size_t size)
{
	if (strchr(entry, '/')) {
		char reason[128];
		if (usable_file(load_as, id, reason, sizeof(reason)) == 0)
			return 1;
		snprintf(why, size, "\"%.64s\": %s", entry, reason);
		return 0;
	}
	enum found f = in_search_dirs(load_as, id);
	if (f != FOUND) {
		enum found c = in_cache(load_as, id);
		f = c == FOUND ? FOUND : (f == UNKNOWN || c == UNKNOWN) ? UNKNOWN : NOT_FOUND;
	}
	if (f == UNKNOWN) {
		/* Kept without an id: the shim judges it in each rank. */
		id->dev = 0;
		id->ino = 0;
		return 1;
	}
	if (f == FOUND)
		return 1;
	if (named)
		snprintf(why, size,
			 "\"%.64s\": no library of that name is found in LD_LIBRARY_PATH, the "
			 "loader's cache or its directories",
			 entry);
	else
		snprintf(why, size,
			 "\"%.64s\" is no keyword (%s) and no library lib%.64s.so is found "
			 "in LD_LIBRARY_PATH, the loader's cache or its directories",
			 entry, TOOLS_KEYWORDS_TEXT, entry);
	return 0;
}

/* Whether ENTRY is usable after the entries SEEN holds; if not, why is
 * appended to OUT->why. */
static int usable(const char *entry, struct seen *seen, struct tools_checked *out)
{
	char why[512] = "";
	const struct tools_keyword *k = keyword(entry);
	if (k) {
		if (k->layer == 0)
			return 1;
		if (!(seen->layers & (1u << k->layer))) {
			seen->layers |= 1u << k->layer;
			return 1;
		}
		snprintf(why, sizeof(why), "\"%.64s\": the %s layer is listed twice", entry,
			 k->layer_name);
	} else {
		/* The shim's rule (shim/src/config.rs, library()): a path or a
		 * loader name as written, a short name x as libx.so. */
		size_t n = strlen(entry);
		int named = strchr(entry, '/') || strstr(entry, ".so.") ||
			    (n >= 3 && strcmp(entry + n - 3, ".so") == 0);
		char load_as[TOOLS_LIST_MAX + 8];
		snprintf(load_as, sizeof(load_as), named ? "%s" : "lib%s.so", entry);
		struct file_id id = {0, 0};
		if (library_found(entry, load_as, named, &id, why, sizeof(why))) {
			/* One loaded object holds one level (the shim refuses it
			 * twice): the same file under two names is listed twice. */
			size_t i = 0;
			while (i < seen->n && !(id.ino && seen->ids[i].dev == id.dev &&
						seen->ids[i].ino == id.ino))
				i++;
			if (i == seen->n) {
				if (seen->n < sizeof(seen->ids) / sizeof(seen->ids[0])) {
					seen->ids[seen->n] = id;
					seen->by[seen->n++] = entry;
				}
				return 1;
			}
			snprintf(why, sizeof(why),
				 "\"%.64s\": the same library as \"%.64s\", which is a level "
				 "already",
				 entry, seen->by[i]);
		}
	}
	append(out->why, sizeof(out->why), "%s%s", out->left_out ? "; " : "", why);
	out->left_out++;
	return 0;
}

void tools_check(const char *list, struct tools_checked *out)
{
	out->kept[0] = '\0';
	out->why[0] = '\0';
	out->left_out = 0;
	char copy[TOOLS_LIST_MAX];
	snprintf(copy, sizeof(copy), "%s", list);
	struct seen seen;
	memset(&seen, 0, sizeof(seen));
	char *save = NULL;
	for (char *e = strtok_r(copy, ",", &save); e; e = strtok_r(NULL, ",", &save)) {
		if (usable(e, &seen, out))
			append(out->kept, sizeof(out->kept), "%s%s", out->kept[0] ? "," : "", e);
	}
}
