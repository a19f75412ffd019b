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
 *       shim=/usr/lib/mpi-observer/libmpi_observer_shim.so [default=stats]
 *
 * With default=LIST every step gets the shim unless the user says
 * --mpi-observer=off. In each task of a step that has it, LD_PRELOAD gets
 * the shim prepended (the shim is inert until the first MPI call, so shells
 * and launchers are not affected) and MPI_TOOLS_ENTRY is set to LIST. A
 * site default does not replace a MPI_TOOLS_ENTRY the user already set.
 *
 * A bad LIST is one error line from srun/sbatch and the job runs without the
 * shim: the observed job is never refused because of the observer. (Under
 * sbatch, each srun in the script inherits the option through the job's
 * environment, SLURM_SPANK__SLURM_SPANK_OPTION_mpi_observer_mpi_observer, and
 * says it again in the job's output.)
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

SPANK_PLUGIN(mpi_observer, 1);

#define LIST_MAX 1024
#define PRELOAD_MAX 8192

/* What the step asked for. */
enum source { FROM_NONE, FROM_DEFAULT, FROM_OPTION };

static char shim_path[PATH_MAX];
static char list[LIST_MAX];
/* The site's default=LIST, which a bare --mpi-observer also means. */
static char site_list[LIST_MAX];
static enum source source = FROM_NONE;
/* Set when the option's value was refused: the step runs without the shim
 * even if a site default would have turned it on. */
static int refused;

/* A tools list: comma-separated items of [A-Za-z0-9_./-], none empty. The
 * shim validates the items themselves; this keeps anything that could be
 * misread in an environment variable (spaces, quotes, '=', ':') out. */
static int valid_list(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n >= LIST_MAX)
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

static int option_cb(int val, const char *optarg, int remote)
{
	(void)val;
	const char *v = optarg && *optarg ? optarg : NULL;
	if (v && strcmp(v, "off") == 0) {
		source = FROM_OPTION;
		list[0] = '\0';
		return 0;
	}
	if (v && !valid_list(v)) {
		/* Once, from the command the user typed (srun, sbatch, salloc);
		 * slurmstepd sees the same value and stays quiet. Returning 0:
		 * a negative value would make srun refuse the job. */
		if (!remote)
			slurm_error("mpi-observer: invalid --mpi-observer value \"%.64s\": "
				    "expected off or a comma-separated tools list "
				    "(letters, digits, _ . / -), e.g. stats; "
				    "running without the observer",
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
		if (!valid_list(site_default)) {
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

	struct stat st;
	if (shim_path[0] == '\0' || stat(shim_path, &st) != 0 || !S_ISREG(st.st_mode)) {
		/* The job runs; the error lands in the step's stderr. */
		slurm_error("mpi-observer: shim \"%s\" is not a regular file "
			    "(shim= in plugstack.conf); running without the observer",
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
					    "the shim; running without the observer");
				return 0;
			}
			spank_setenv(sp, "LD_PRELOAD", preload, 1);
		}
	} else if (rc == ESPANK_NOSPACE) {
		slurm_error("mpi-observer: LD_PRELOAD is too long to add the shim; "
			    "running without the observer");
		return 0;
	} else {
		spank_setenv(sp, "LD_PRELOAD", shim_path, 1);
	}
	/* A site default keeps a list the user chose; an explicit option wins. */
	spank_setenv(sp, "MPI_TOOLS_ENTRY", list, source == FROM_OPTION);
	return 0;
}
