# Two commands do all set-up: `make lab` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

.PHONY: lab test check lint install clean-venv

# torch is pinned and installed first, so pip never resolves an unpinned (multi-GB CUDA) torch.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

# Students work in the released (solution-free) notebooks under build/release/; labs missing
# there are generated first, labs already there are never overwritten. PYTHONPATH lets the
# kernels import minillm/autograder from this checkout whatever the notebook's folder.
lab: $(STAMP)
	$(PY) -m autograder release --missing
	PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(VENV)/bin/jupyter lab \
		--notebook-dir=build/release $(if $(filter 0,$(shell id -u)),--allow-root,)

# Two pytest-xdist workers (the CI machine has 2 cores); a lab's notebook runs, the browser
# module and the speed checks are grouped so each group stays on one worker. Each worker, and
# every process it starts, gets its share of the cores for torch's threads and Inductor's compile
# workers (tests/conftest.py). TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup)
test: lint
	$(PY) -m pytest $(XDIST)

# The developer loop (under 3 minutes on 2 cores): lint, the layer check, and every test not
# marked slow (no notebook pipeline, sandbox, tamper suite, browser, slide decks or repeated speed
# checks).
check: lint
	$(PY) -m pytest $(XDIST) -q -m "not slow"

# ruff (pycodestyle, pyflakes, import order; settings in pyproject.toml) over code and notebooks.
lint: $(STAMP)
	$(PY) -m ruff check .

clean-venv:
	rm -rf $(VENV)

# Grading (autograder/README.md). release: student versions of every lab (or LABS="00_sampling
# 01_roofline") -> build/release/, registered in build/gradebook.db; overwrites build/release;
# EXCHANGE=dir also publishes them to that nbgrader exchange (a shared JupyterHub's).
# collect: EXCHANGE=dir (the newest submission of each student) or ZIP=file LAB=lab (an LMS
# download, Canvas's file names; ZIP_DATES=1 takes lateness from the zip's dates) ->
# build/submitted/. deadline: LAB=lab DUE="2026-12-04 17:00 UTC"; extend: LAB STUDENT DAYS.
# grade: SUBMISSIONS=dir (default build/submitted, where collect puts them) holding
# dir/<student>/<lab>/<lab>.ipynb -> gradebook, build/grades.csv,
# build/feedback/; JOBS=N executes N at once, SCHEDULER=tcp://host:port on a Dask cluster; each
# kernel runs in a bubblewrap sandbox (apt-get install bubblewrap; see autograder/README.md);
# SIMILARITY=1 compares the answers (copydetect; ARCHIVE=dir adds earlier terms' submissions).
# selfgrade: NB=path/to/notebook.ipynb, graded in a temporary course; ANSWERS=1 then shows the
# model answers and rubrics of the written answers you have written. release, grade and report
# run one at a time on build/ (a second one waits up to AUTOGRADER_LOCK_WAIT=600 seconds).
.PHONY: release collect deadline extend grade selfgrade formgrade report

release: $(STAMP)
	$(PY) -m autograder release $(LABS) $(if $(EXCHANGE),--exchange "$(EXCHANGE)",)

collect: $(STAMP)
	@test -n "$(EXCHANGE)$(ZIP)" || { echo "usage: make collect EXCHANGE=dir [LABS=...] | make collect ZIP=file LAB=lab"; exit 2; }
	$(PY) -m autograder collect $(if $(ZIP),$(LAB) --zip "$(ZIP)" $(if $(ZIP_DATES),--zip-dates,),$(LABS) --exchange "$(EXCHANGE)")

deadline: $(STAMP)
	@test -n "$(LAB)" -a -n "$(DUE)" || { echo 'usage: make deadline LAB=lab DUE="2026-12-04 17:00 UTC"'; exit 2; }
	$(PY) -m autograder deadline $(LAB) "$(DUE)"

extend: $(STAMP)
	@test -n "$(LAB)" -a -n "$(STUDENT)" || { echo "usage: make extend LAB=lab STUDENT=id DAYS=n"; exit 2; }
	$(PY) -m autograder extend $(LAB) $(STUDENT) --days $(or $(DAYS),0) --hours $(or $(HOURS),0)

grade: $(STAMP)
	$(PY) -m autograder grade "$(or $(SUBMISSIONS),build/submitted)" $(if $(JOBS),--jobs $(JOBS),) \
		$(if $(SCHEDULER),--scheduler $(SCHEDULER),) $(if $(SIMILARITY),--similarity,) \
		$(if $(ARCHIVE),--similarity-archive $(ARCHIVE),)

selfgrade: $(STAMP)
	@test -n "$(NB)" || { echo "usage: make selfgrade NB=path/to/notebook.ipynb"; exit 2; }
	$(PY) -m autograder selfgrade "$(NB)" $(if $(ANSWERS),--answers,)

# Slides (slides/build.py): every deck slides/NN_topic.md -> build/slides/NN_topic.html, one
# self-contained offline file each (figures computed by minillm); PDF=1 also prints each deck to
# build/slides/NN_topic.pdf with chromium. Open the HTML in a browser: arrow keys, n for notes.
.PHONY: slides

slides: $(STAMP)
	$(PY) -m slides.build $(if $(PDF),--pdf,)

# Written answers are graded by hand in nbgrader's formgrader (autograder/README.md, "Grading
# written answers"): JupyterLab on the course root, menu Nbgrader > Formgrader. Then `make report`
# writes build/grades.csv and the feedback (with the graders' comments) again.
formgrade: $(STAMP)
	$(VENV)/bin/jupyter lab --notebook-dir=$(CURDIR) $(if $(filter 0,$(shell id -u)),--allow-root,)

report: $(STAMP)
	$(PY) -m autograder report $(LABS)

# A lent CUDA GPU (benchmarks/gpu_check.py; ../shared/GPU.md): `make gpu-pack` here leaves out the
# models the GPU run never loads and packs the packages it lacks into .gpu/; `make gpu-check`
# there (its own python3: torch and triton as installed, nothing fetched; carry [".gpu"], OUT=dir
# for what comes back); `make gpu-record FROM=dir/gpu_check.json` here adds its section to
# benchmarks/RESULTS.md (APPEND=1 adds it at once on a GPU of your own); `make gpu-unpack` puts
# the models back. DRY_RUN=1 runs on a CPU every step that can run without a GPU; SWEEPS=1 adds
# the kernels' block-size sweeps (up to 14 more minutes).
.PHONY: gpu-check gpu-pack gpu-unpack gpu-record
GPU_PY = $(if $(wildcard $(PY)),$(PY),python3)

gpu-check: $(if $(DRY_RUN),$(STAMP),)
	$(GPU_PY) -m benchmarks.gpu_check $(if $(DRY_RUN),--dry-run,) $(if $(OUT),--out "$(OUT)",) \
		$(if $(APPEND),--append,) $(if $(SWEEPS),--sweeps,)

gpu-pack: $(STAMP)
	$(PY) -m benchmarks.gpu_check --pack

gpu-unpack:
	$(GPU_PY) -m benchmarks.gpu_check --unpack

gpu-record: $(STAMP)
	@test -n "$(FROM)" || { echo "usage: make gpu-record FROM=path/to/gpu_check.json"; exit 2; }
	$(PY) -m benchmarks.gpu_check --record "$(FROM)"
