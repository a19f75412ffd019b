/*
 * tools_check: what the SPANK plugin makes of a tools list (the shim's
 * MPI_TOOLS_ENTRY) before a job starts, read as the shim reads it
 * (shim/src/config.rs, shim/src/layers.rs): each entry a keyword of the
 * shim's (tools_list.h, generated from the shim's own table) or a library
 * the dynamic loader can find from here.
 *
 * No Slurm in here: the plugin calls it from srun's option callback, and
 * xtask's test compiles it alone and compares its verdicts with the shim's
 * parser (xtask/src/codegen_slurm.rs).
 */
#ifndef MPI_OBSERVER_TOOLS_CHECK_H
#define MPI_OBSERVER_TOOLS_CHECK_H

#include <stddef.h>

/* The longest list the plugin takes, NUL included. */
#define TOOLS_LIST_MAX 1024
/* Room for the reasons of every entry left out. */
#define TOOLS_WHY_MAX 2048

/* A checked list. */
struct tools_checked {
	/* The usable entries, in list order, comma-separated ("" if none). */
	char kept[TOOLS_LIST_MAX];
	/* Why each entry left out was, "; "-separated, in list order. */
	char why[TOOLS_WHY_MAX];
	/* How many entries were left out. */
	int left_out;
};

/*
 * Whether LIST is a tools list the plugin passes on at all: comma-separated
 * items of [A-Za-z0-9_./-], none empty, shorter than TOOLS_LIST_MAX. This
 * keeps anything that could be misread in an environment variable (spaces,
 * quotes, '=', ':') out.
 */
int tools_list_valid(const char *list);

/*
 * Checks each entry of LIST (tools_list_valid) as the shim would take it:
 * - a keyword: kept, but a layer keyword (stats, fort/fortran) only once;
 * - a path (it has a '/'): a regular, readable shared object of this
 *   process's kind (ELF class, byte order, machine), relative paths from
 *   the working directory;
 * - a loader name (libx.so, libx.so.1) or a short name (x: libx.so): such a
 *   file in a directory the loader searches from here (LD_LIBRARY_PATH and
 *   its default directories, as dlinfo(RTLD_DI_SERINFO) lists them) or in
 *   its cache (/etc/ld.so.cache). When the search cannot be completed (an
 *   unreadable or unknown cache), the entry is kept: the shim, told to
 *   skip what it cannot load, has the last word in each rank.
 */
void tools_check(const char *list, struct tools_checked *out);

#endif
