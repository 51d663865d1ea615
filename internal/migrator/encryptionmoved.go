package migrator

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// The end of a pass under an encryption target: the API servers are counted
// again (lag.go), then their encryption states read again (encryption.go),
// and any difference from the start is said, so that no key is called
// unused on a pass that may have written under another.

// encryptionMoved reads every API server's encryption state again at the
// end of a pass over target and says how it differs from began, the one
// the migration began with (kept in its checkpoint across resumes), or that
// it could not be read; "" when every server kept one state throughout.
func (m *Migrator) encryptionMoved(ctx context.Context, target Target, began *EncryptionState) string {
	// Counted again: a server that joined during the pass may have
	// written under another key.
	lagWait, servers, err := m.lagWait(ctx)
	if err != nil {
		return "at the end of the pass, restow could not count the API servers: " + Message(err)
	}
	if lagWait != target.LagWait || servers.unseen != target.unseen || !slices.Equal(servers.addresses, target.APIServerAddresses) {
		return fmt.Sprintf("the API servers changed during the pass (%s at the start, %s at the end)", target.APIServerSignals, servers.signals)
	}
	now, readings, err := m.readEncryptionStates(ctx, target)
	switch {
	case err != nil:
		return "at the end of the pass, " + Message(err)
	case began == nil:
		return "the pass kept no encryption state of its start"
	case !now.Equal(*began):
		return fmt.Sprintf("the API servers loaded %s during the pass, which began under %s", now, began)
	}
	return epochsMoved(began, readings)
}

// epochsMoved says which server began another epoch since began was read: a
// restart, a reload, or another KMS v2 key ID stamped later; "" if none.
func epochsMoved(began *EncryptionState, readings []serverReading) string {
	var moved []string
	for _, r := range readings {
		who := r.epoch.Address
		if who == "" {
			who = "the API server"
		}
		i := slices.IndexFunc(began.Servers, func(e ServerEpoch) bool { return e.Address == r.epoch.Address })
		if i < 0 {
			moved = append(moved, who+" was not read when the pass began")
			continue
		}
		start := began.Servers[i]
		if r.epoch.ProcessStart != start.ProcessStart {
			moved = append(moved, who+" restarted")
		}
		if r.epoch.Reloads != start.Reloads {
			moved = append(moved, fmt.Sprintf("%s reloaded its encryption configuration %d times", who, r.epoch.Reloads-start.Reloads))
		}
		for stamped, at := range r.stamps {
			if at > start.KMSStampedBy && !slices.Contains(began.KMSKeyIDHashes, stamped) {
				provider, _, _ := strings.Cut(stamped, "=")
				moved = append(moved, fmt.Sprintf("%s's KMS v2 provider %s reported another key ID", who, provider))
			}
		}
	}
	if len(moved) == 0 {
		return ""
	}
	slices.Sort(moved)
	return "during the pass " + strings.Join(slices.Compact(moved), "; ") + ", so it may have written under another key meanwhile, although it reports the same state at both ends"
}
