package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/razorbill/flo/libs/localpg"
)

// riverTotal matches the last line of `river bench --duration`: the jobs it
// worked in all and over how long.
var riverTotal = regexp.MustCompile(`total jobs worked \[\s*(\d+)\s*\].*running ([0-9.]+[a-zµ]+)`)

// benchRiver runs River's own benchmark, `river bench` (the binary at
// o.river, which `make river` builds), for o.sustain against a private
// Postgres started as the platform's is (same server settings, same fsync),
// and prints its rate with the Postgres and process CPU it spent per 1,000
// jobs, in the columns of the sustained actions table. Run beside
// `-mode actions -sustain`, it puts the two queues on one box in one sitting.
func benchRiver(ctx context.Context, o options) error {
	if o.river == "" || o.sustain <= 0 {
		return fmt.Errorf("-mode river needs -river (the binary `make river` builds) and -sustain")
	}
	dir, err := privateDir("flo-bench-river-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	pg, err := localpg.Start(ctx, filepath.Join(dir, "pg"), 0, localpg.Options{Fsync: o.fsync})
	if err != nil {
		return err
	}
	defer pg.Stop()
	if err := pg.CreateDatabase(ctx, "river"); err != nil {
		return err
	}
	version, err := exec.CommandContext(ctx, o.river, "version").Output()
	if err != nil {
		return fmt.Errorf("river version: %w", err)
	}
	url := pg.URL("river")
	if out, err := exec.CommandContext(ctx, o.river, "migrate-up", "--database-url", url).CombinedOutput(); err != nil {
		return fmt.Errorf("river migrate-up: %w\n%s", err, out)
	}
	db, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("connect to postgres: %w", err)
	}
	defer db.Close(context.Background())
	pid, err := postmaster(ctx, db)
	if err != nil {
		return err
	}
	pgBefore, err := postgresCPU(pid)
	if err != nil {
		return err
	}
	commitsBefore, err := commits(ctx, db)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, o.river, "bench", "--database-url", url, "--duration", o.sustain.String())
	cmd.Stdout, cmd.Stderr = &out, io.Discard
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("river bench: %w\n%s", err, out.Bytes())
	}
	pgAfter, err := postgresCPU(pid)
	if err != nil {
		return err
	}
	// Backends publish their commit counts at most once a second.
	if err := sleep(ctx, time.Second); err != nil {
		return err
	}
	commitsAfter, err := commits(ctx, db)
	if err != nil {
		return err
	}
	worked, took, err := riverResult(out.Bytes())
	if err != nil {
		return err
	}
	process := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	fmt.Printf("%s: river bench for %s, fsync=%v; River inserts and works its jobs in one process over a private Postgres like the platform's\n\n",
		bytes.TrimSpace(bytes.SplitN(version, []byte("\n"), 2)[0]), o.sustain, o.fsync)
	fmt.Println("| run | jobs/s | Postgres commits/s | Postgres CPU ms per 1k jobs | process CPU ms per 1k jobs |")
	fmt.Println("|---|---|---|---|---|")
	fmt.Printf("| river bench | %.0f | %.0f | %s | %s |\n", float64(worked)/took.Seconds(),
		float64(commitsAfter-commitsBefore)/took.Seconds(), perThousand(pgAfter-pgBefore, worked), perThousand(process, worked))
	return nil
}

// riverResult reads the jobs `river bench --duration` worked and the time it
// ran from its output.
func riverResult(out []byte) (int64, time.Duration, error) {
	m := riverTotal.FindSubmatch(out)
	if m == nil {
		return 0, 0, fmt.Errorf("river bench: no total in its output:\n%s", out)
	}
	worked, err := strconv.ParseInt(string(m[1]), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("river bench: total %q: %w", m[1], err)
	}
	took, err := time.ParseDuration(string(m[2]))
	if err != nil {
		return 0, 0, fmt.Errorf("river bench: duration %q: %w", m[2], err)
	}
	if worked == 0 || took <= 0 {
		return 0, 0, fmt.Errorf("river bench: %d jobs in %s", worked, took)
	}
	return worked, took, nil
}
