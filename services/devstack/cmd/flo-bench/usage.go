package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/encoding/protowire"
)

// replicaLabel is the pprof label set around each dispatcher replica's start,
// so every goroutine the replica spawns carries it and the CPU profile can
// charge its samples to it.
const replicaLabel = "dispatcher"

// clockTicks is USER_HZ, the unit of the CPU times in /proc/<pid>/stat: 100
// on every Linux this runs on (sysconf would need cgo).
const clockTicks = 100

// processCPU is the CPU time (user and system, every thread) this process
// has used: the services, the workers and the load generator, not Postgres.
func processCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// postmaster finds the pid of the Postgres server db is connected to: the
// parent of its backend. It must run on this machine (the private Postgres of
// the platform); 0 when it does not.
func postmaster(ctx context.Context, db *pgx.Conn) (int, error) {
	var backend int
	if err := db.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return 0, fmt.Errorf("postgres backend pid: %w", err)
	}
	st, err := procStat(backend)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return st.ppid, nil
}

// postgresCPU is the CPU time the Postgres server rooted at pid has used:
// the postmaster's own, its exited children's (which the kernel adds to the
// parent's cutime and cstime) and its live children's (backends, WAL writer,
// checkpointer...). A child that exits between two readings moves from the
// last sum to the second, so differences stay whole.
func postgresCPU(pid int) (time.Duration, error) {
	root, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	ticks := root.utime + root.stime + root.cutime + root.cstime
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, fmt.Errorf("list processes: %w", err)
	}
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := procStat(child)
		if err != nil || st.ppid != pid {
			// Gone since the listing, or not ours.
			continue
		}
		ticks += st.utime + st.stime
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// stat holds the fields of /proc/<pid>/stat the bench reads.
type stat struct {
	ppid                         int
	utime, stime, cutime, cstime int64
}

// procStat reads /proc/<pid>/stat (see proc(5)).
func procStat(pid int) (stat, error) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return stat{}, fmt.Errorf("read process stat: %w", err)
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return stat{}, fmt.Errorf("process %d stat: no command name", pid)
	}
	// From field 3: state, ppid (4), ..., utime (14), stime, cutime, cstime.
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 15 {
		return stat{}, fmt.Errorf("process %d stat: %d fields", pid, len(f))
	}
	var st stat
	var nums [5]int64
	for k, field := range []int{1, 11, 12, 13, 14} {
		if nums[k], err = strconv.ParseInt(f[field], 10, 64); err != nil {
			return stat{}, fmt.Errorf("process %d stat: %w", pid, err)
		}
	}
	st.ppid = int(nums[0])
	st.utime, st.stime, st.cutime, st.cstime = nums[1], nums[2], nums[3], nums[4]
	return st, nil
}

// usage is the CPU, memory and commits counters at one moment, or between
// two.
type usage struct {
	cpu     time.Duration // this process's
	pgCPU   time.Duration // the private Postgres's, -1 when it is not on this machine
	commits int64
	// allocated and collections are this process's heap bytes allocated
	// and garbage collections: what a unit costs the collector, which
	// takes a core for tens of milliseconds each cycle on this box.
	allocated, collections uint64
}

// heapCounters are the runtime's cumulative allocation and collection counts.
func heapCounters() (allocated, collections uint64) {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}, {Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(s)
	return s[0].Value.Uint64(), s[1].Value.Uint64()
}

// readUsage reads the counters; pgPID is the Postgres postmaster, 0 when
// Postgres is not on this machine.
func readUsage(ctx context.Context, db *pgx.Conn, pgPID int) (usage, error) {
	u := usage{pgCPU: -1}
	u.allocated, u.collections = heapCounters()
	var err error
	if u.cpu, err = processCPU(); err != nil {
		return usage{}, err
	}
	if pgPID != 0 {
		if u.pgCPU, err = postgresCPU(pgPID); err != nil {
			return usage{}, err
		}
	}
	if u.commits, err = commits(ctx, db); err != nil {
		return usage{}, err
	}
	return u, nil
}

// sub is what was used from before to u.
func (u usage) sub(before usage) usage {
	d := usage{cpu: u.cpu - before.cpu, pgCPU: -1, commits: u.commits - before.commits,
		allocated: u.allocated - before.allocated, collections: u.collections - before.collections}
	if u.pgCPU >= 0 && before.pgCPU >= 0 {
		d.pgCPU = u.pgCPU - before.pgCPU
	}
	return d
}

// commits is Postgres's own count of committed transactions, all databases.
// Backends publish their counts at most once a second, so a window's
// difference is exact to about a second's worth at each end.
func commits(ctx context.Context, db *pgx.Conn) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, `SELECT coalesce(sum(xact_commit), 0)::bigint FROM pg_stat_database`).Scan(&n); err != nil {
		return 0, fmt.Errorf("read postgres commits: %w", err)
	}
	return n, nil
}

// recordProfile starts a CPU profile of the process; stop ends it and returns
// the profile (gzipped protobuf, as pprof writes it).
func recordProfile() (stop func() []byte, err error) {
	var buf bytes.Buffer
	if err := pprof.StartCPUProfile(&buf); err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() []byte {
		pprof.StopCPUProfile()
		return buf.Bytes()
	}, nil
}

// cpuByLabel sums the CPU time of a profile's samples by the value of their
// label key; samples without it are not counted. It reads the few fields of
// the profile.proto message it needs: Profile.sample (2) with Sample.value
// (2; the second value of a CPU profile is nanoseconds) and Sample.label (3:
// key 1, str 2, both string-table indexes), and Profile.string_table (6).
func cpuByLabel(gz []byte, key string) (map[string]time.Duration, error) {
	r, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, fmt.Errorf("read profile: %w", err)
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read profile: %w", err)
	}
	var (
		samples []sample
		strs    []string
	)
	err = fields(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		switch {
		case num == 2 && typ == protowire.BytesType:
			s, err := parseSample(v)
			if err != nil {
				return err
			}
			samples = append(samples, s)
		case num == 6 && typ == protowire.BytesType:
			strs = append(strs, string(v))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	str := func(i int64) string {
		if i < 0 || i >= int64(len(strs)) {
			return ""
		}
		return strs[i]
	}
	by := map[string]time.Duration{}
	for _, s := range samples {
		for _, l := range s.labels {
			if str(l[0]) == key {
				by[str(l[1])] += s.cpu
			}
		}
	}
	return by, nil
}

// sample is one profile sample: its CPU time and its string labels as
// (key, value) string-table indexes.
type sample struct {
	cpu    time.Duration
	labels [][2]int64
}

func parseSample(b []byte) (sample, error) {
	var s sample
	var values []int64
	err := fields(b, func(num protowire.Number, typ protowire.Type, v []byte) error {
		switch {
		case num == 2 && typ == protowire.VarintType:
			x, _ := protowire.ConsumeVarint(v)
			values = append(values, int64(x))
		case num == 2 && typ == protowire.BytesType: // packed
			for len(v) > 0 {
				x, n := protowire.ConsumeVarint(v)
				if n < 0 {
					return fmt.Errorf("read profile sample: %w", protowire.ParseError(n))
				}
				values = append(values, int64(x))
				v = v[n:]
			}
		case num == 3 && typ == protowire.BytesType:
			var l [2]int64
			err := fields(v, func(num protowire.Number, typ protowire.Type, v []byte) error {
				if typ == protowire.VarintType && (num == 1 || num == 2) {
					x, _ := protowire.ConsumeVarint(v)
					l[num-1] = int64(x)
				}
				return nil
			})
			if err != nil {
				return err
			}
			s.labels = append(s.labels, l)
		}
		return nil
	})
	if err != nil {
		return sample{}, err
	}
	if len(values) < 2 {
		return sample{}, errors.New("read profile sample: not a CPU profile")
	}
	s.cpu = time.Duration(values[1])
	return s, nil
}

// fields calls fn for each field of a protobuf message: for a varint the
// varint's bytes, for a length-delimited field its contents.
func fields(b []byte, fn func(protowire.Number, protowire.Type, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("read profile: %w", protowire.ParseError(n))
		}
		b = b[n:]
		var v []byte
		switch typ {
		case protowire.VarintType:
			_, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return fmt.Errorf("read profile: %w", protowire.ParseError(m))
			}
			v, n = b[:m], m
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return fmt.Errorf("read profile: %w", protowire.ParseError(n))
		}
		if err := fn(num, typ, v); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}
