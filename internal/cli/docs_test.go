package cli_test

import (
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/restow/restow/internal/cli"
	"github.com/restow/restow/internal/migrator"
	"github.com/restow/restow/internal/migrator/quota"
)

// TestExitCodes: docs/cli.md's table of exit codes gives every code the
// plugin exits with, no other, and its row for exit 2 names each reason
// that stops run's pass before it prunes. (Each command's flags are in the
// reference generated from the commands, which make verify holds.)
func TestExitCodes(t *testing.T) {
	raw, err := os.ReadFile("../../docs/cli.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(raw), "\n## Exit codes\n")
	if !ok {
		t.Fatal("docs/cli.md has no section ## Exit codes")
	}
	table, _, _ = strings.Cut(table, "\n## ")
	rows := map[int]string{}
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			continue
		}
		if code, err := strconv.Atoi(strings.TrimSpace(cells[1])); err == nil {
			rows[code] = cells[2]
		}
	}
	codes := []int{0, 1, cli.ExitPending, cli.ExitTimeout, cli.ExitNoOperator, cli.ExitMismatch, cli.ExitDanger, cli.ExitUnaccounted, cli.ExitBlocked}
	for _, code := range codes {
		if _, ok := rows[code]; !ok {
			t.Errorf("docs/cli.md's exit codes give no row for %d", code)
		}
	}
	for code := range rows {
		if !slices.Contains(codes, code) {
			t.Errorf("docs/cli.md's exit codes give %d, which the plugin never exits with", code)
		}
	}
	for _, reason := range []string{migrator.ReasonAPIServerLagging, quota.ReasonQuota, quota.ReasonNotCompacting, quota.ReasonAlarm} {
		if !strings.Contains(rows[cli.ExitPending], reason) {
			t.Errorf("docs/cli.md's row for exit %d does not name %s", cli.ExitPending, reason)
		}
	}
}
