/*
 * spank_mpi_observer: a SPANK plugin that puts mpi-observer's shim under a
 * job step's tasks.
 *
 *   srun --mpi-observer[=LIST] ...     LIST: the shim's tools list
 *   sbatch --mpi-observer[=LIST] ...   (MPI_TOOLS_ENTRY), default "stats";
 *                                      "off" opts out
 *
 * plugstack.conf:
 *   optional /usr/lib/x86_64-linux-gnu/slurm-wlm/spank_mpi_observer.so \
 *       [shim=PATH] [default=LIST]
 *
 * shim= defaults to where the package installs the shim (DEFAULT_SHIM, which
 * slurm/Makefile takes from the package's description). With default=LIST
 * every step gets the shim unless the user says --mpi-observer=off. In each
 * task of a step that has it, LD_PRELOAD gets the shim prepended (the shim
 * is inert until the first MPI call, so shells and launchers are not
 * affected) and MPI_TOOLS_ENTRY is set to LIST. A site default does not
 * replace a MPI_TOOLS_ENTRY the user already set.
 *
 * The observed job is never refused nor ended because of the observer:
 * - srun (sbatch, salloc) checks the list once, before the job starts
 *   (tools_check.c): each entry must be a keyword of the shim's or a
 *   library the loader finds from there. What is not is left out, in one
 *   error line naming each entry and why; the step runs with the rest, or
 *   without the shim if nothing is left. A malformed value (a space, a
 *   quote...) is one line and no shim. The tasks get what srun kept,
 *   through CHECKED_VAR in the job's environment.
 * - Every task the plugin preloads gets MPI_OBSERVER_TOOLS_ON_ERROR=skip:
 *   an entry the shim still cannot use in a rank (a library the compute
 *   node lacks) is left out there with one line, instead of ending the
 *   rank as the shim does for a list given by hand.
 * (Under sbatch, each srun in the script inherits the option through the
 * job's environment, SLURM_SPANK__SLURM_SPANK_OPTION_mpi_observer_mpi_observer,
 * checks it again and says it again in the job's output.)
 *
 * "optional" in plugstack.conf: if the package is removed and the file is
 * gone, Slurm carries on without it.
 */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

#include "tools_check.h"
#include "tools_list.h"

#ifndef DEFAULT_SHIM
#error "DEFAULT_SHIM: the shim's installed path (slurm/Makefile's SHIM_PATH)"
#endif

SPANK_PLUGIN(mpi_observer, 1);

#define LIST_MAX TOOLS_LIST_MAX
#define PRELOAD_MAX 8192
/* What srun (sbatch, salloc) kept of the list, for the tasks: set in the
 * job's environment before the job starts, read and removed in each task.
 * SLURM_ in its name: Slurm passes SLURM_* variables even under
 * --export=NONE. */
#define CHECKED_VAR "SLURM_MPI_OBSERVER_TOOLS"

/* What the step asked for. */
enum source { FROM_NONE, FROM_DEFAULT, FROM_OPTION };

static char shim_path[PATH_MAX] = DEFAULT_SHIM;
static char list[LIST_MAX];
/* The site's default=LIST, which a bare --mpi-observer also means. */
static char site_list[LIST_MAX];
static enum source source = FROM_NONE;
/* Set when the option's value was refused: the step runs without the shim
 * even if a site default would have turned it on. */
static int refused;

static int option_cb(int val, const char *optarg, int remote)
{
	(void)val;
	const char *v = optarg && *optarg ? optarg : NULL;
	if (v && strcmp(v, "off") == 0) {
		source = FROM_OPTION;
		list[0] = '\0';
		return 0;
	}
	if (v && !tools_list_valid(v)) {
		/* Once, from the command the user typed (srun, sbatch, salloc);
		 * slurmstepd sees the same value and stays quiet. Returning 0:
		 * a negative value would make srun refuse the job. */
		if (!remote)
			slurm_error("mpi-observer: invalid --mpi-observer value \"%.64s\": "
				    "expected off or a comma-separated tools list "
				    "(letters, digits, _ . / -), e.g. stats; "
				    "running without the shim",
				    v);
		refused = 1;
		source = FROM_NONE;
		list[0] = '\0';
		return 0;
	}
	refused = 0;
	source = FROM_OPTION;
	snprintf(list, sizeof(list), "%s", v ? v : site_list[0] ? site_list : "stats");
	return 0;
}

static struct spank_option option = {
	"mpi-observer", "[LIST]",
	"Observe the step's MPI calls with mpi-observer's shim; LIST is the "
	"tools list (default: the site's, else stats), off opts out",
	2 /* optional argument */, 0, option_cb
};

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	const char *site_default = NULL;
	for (int i = 0; i < ac; i++) {
		if (strncmp(av[i], "shim=", 5) == 0) {
			snprintf(shim_path, sizeof(shim_path), "%s", av[i] + 5);
		} else if (strncmp(av[i], "default=", 8) == 0) {
			site_default = av[i] + 8;
		} else {
			slurm_error("mpi-observer: unknown plugstack.conf argument \"%s\": "
				    "expected shim=PATH or default=LIST",
				    av[i]);
			return -1;
		}
	}
	if (site_default && strcmp(site_default, "off") != 0) {
		if (!tools_list_valid(site_default)) {
			slurm_error("mpi-observer: invalid default=\"%s\" in plugstack.conf: "
				    "expected off or a comma-separated tools list",
				    site_default);
			return -1;
		}
		/* Before option processing: an option given on the command line
		 * (callback after init) replaces it. */
		snprintf(list, sizeof(list), "%s", site_default);
		snprintf(site_list, sizeof(site_list), "%s", site_default);
		source = FROM_DEFAULT;
	}
	if (spank_option_register(sp, &option) != ESPANK_SUCCESS) {
		slurm_error("mpi-observer: cannot register --mpi-observer");
		return -1;
	}
	return 0;
}

/* In srun, sbatch or salloc, after the options: checks the step's list
 * where the user typed it, says once what it leaves out, and hands what it
 * keeps to the tasks (CHECKED_VAR). Never an error: the job runs. */
int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (spank_remote(sp) != 0)
		return 0;
	const char *own = getenv(TOOLS_LIST_VAR);
	/* Nothing to check: no shim, or a site default under a list the user
	 * set (which the tasks keep; the shim judges it). Nothing stale either:
	 * an earlier step's value must not reach these tasks. */
	if (refused || source == FROM_NONE || list[0] == '\0' ||
	    (source == FROM_DEFAULT && own && *own)) {
		unsetenv(CHECKED_VAR);
		return 0;
	}
	struct tools_checked c;
	tools_check(list, &c);
	if (c.left_out) {
		char what[LIST_MAX + 64];
		if (source == FROM_OPTION)
			snprintf(what, sizeof(what), "--mpi-observer=%s", list);
		else
			snprintf(what, sizeof(what), "default=%s in plugstack.conf", list);
		if (c.kept[0])
			slurm_error("mpi-observer: %.200s: %s; running with --mpi-observer=%s", what,
				    c.why, c.kept);
		else
			slurm_error("mpi-observer: %.200s: %s; running without the shim", what, c.why);
	}
	setenv(CHECKED_VAR, c.kept, 1);
	return 0;
}

/* In each task, just before exec, as the user. */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (refused || source == FROM_NONE || list[0] == '\0')
		return 0;

	/* Not the batch script's shell: the sruns it runs inherit the option
	 * (Slurm exports it to the job's environment) and set up their own
	 * steps' tasks. */
	uint32_t step = 0;
	if (spank_get_item(sp, S_JOB_STEPID, &step) == ESPANK_SUCCESS &&
	    (step == SLURM_BATCH_SCRIPT || step == SLURM_EXTERN_CONT))
		return 0;

	/* What srun kept of the list; "" when it kept nothing. Absent when no
	 * srun checked it (the job's environment was not passed on): the shim
	 * judges each entry then. */
	char checked[LIST_MAX];
	const char *use = list;
	if (spank_getenv(sp, CHECKED_VAR, checked, sizeof(checked)) == ESPANK_SUCCESS) {
		spank_unsetenv(sp, CHECKED_VAR);
		if (checked[0] == '\0')
			return 0;
		if (tools_list_valid(checked))
			use = checked;
	}

	struct stat st;
	if (shim_path[0] == '\0' || stat(shim_path, &st) != 0 || !S_ISREG(st.st_mode)) {
		/* The job runs; the error lands in the step's stderr. */
		slurm_error("mpi-observer: shim \"%s\" is not a regular file "
			    "(shim= in plugstack.conf); running without the shim",
			    shim_path);
		return 0;
	}

	char old[PRELOAD_MAX];
	char preload[PRELOAD_MAX];
	spank_err_t rc = spank_getenv(sp, "LD_PRELOAD", old, sizeof(old));
	if (rc == ESPANK_SUCCESS && old[0] != '\0') {
		if (strstr(old, shim_path) == NULL) {
			int n = snprintf(preload, sizeof(preload), "%s:%s", shim_path, old);
			if (n < 0 || (size_t)n >= sizeof(preload)) {
				slurm_error("mpi-observer: LD_PRELOAD is too long to add "
					    "the shim to; running without it");
				return 0;
			}
			spank_setenv(sp, "LD_PRELOAD", preload, 1);
		}
	} else if (rc == ESPANK_NOSPACE) {
		slurm_error("mpi-observer: LD_PRELOAD is too long to add the shim to; "
			    "running without it");
		return 0;
	} else {
		spank_setenv(sp, "LD_PRELOAD", shim_path, 1);
	}
	/* A site default keeps a list the user chose; an explicit option wins. */
	spank_setenv(sp, TOOLS_LIST_VAR, use, source == FROM_OPTION);
	/* Whatever the list, the shim this plugin preloads never ends a rank
	 * over an entry it cannot use: it leaves it out, with one line. */
	spank_setenv(sp, TOOLS_ON_ERROR_VAR, TOOLS_ON_ERROR_SKIP, 1);
	return 0;
}
