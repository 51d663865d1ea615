// Package preflight owns a CRD upgrade that the API server would refuse:
// a manifest that drops a version the live CRD's status.storedVersions
// still lists is refused ("missing from spec.versions" since Kubernetes
// 1.33, "must appear in spec.versions" before), however the apply is made
// (kubectl, Helm, Argo CD, Flux). Check says, writing nothing, what the
// apply needs (kubectl restow preflight); Prepare does it (kubectl restow
// prepare). The command line parses flags, calls them and prints.
//
// Prepare takes one CRD through these steps, in the order they happen;
// each file holds one:
//
//   - plan (check.go, judge.go): read the manifests (manifest.go) and the
//     live CRD, judge what the apply needs (Judge, pure: nothing, a
//     migration to the live storage version, or one through a bridge
//     version both sides serve), and confirm it with a server-side dry run;
//   - check (fields.go, roundtrip.go): where the apply needs a bridge or
//     the conversion is a webhook, prove that no object loses a field, by
//     the API server's own reads and strict dry runs, or by a round trip
//     through the webhook; the schemas compared in schema.go. A CRD that
//     would lose one is blocked, and nothing is written;
//   - switch (switch.go): make the bridge the live storage version, as the
//     field manager that owns spec.versions, on the CRD that was checked
//     only; check a webhook's round trip again, and move it back on a loss;
//   - migrate: the caller's Migrate (through the restow operator, or in the
//     caller's process) rewrites every object and prunes
//     status.storedVersions;
//   - re-check (check.go again): the plan once more; the apply must pass.
//
// What the walk goes back to, and why: check.go, whose plan is run again
// as the re-check and whose dry run confirms the check's verdict; and
// fields.go, whose helpers the round trip shares (listing every object,
// strict dry runs).
package preflight

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Preparer prepares CRDs on one cluster.
type Preparer struct {
	// Client reads and writes CRDs and their objects; its scheme knows
	// restow's StorageMigrations, whose records Check reads.
	Client client.Client
	// TrustWebhook vouches for a CRD's conversion webhook where a bridge
	// needs one (--trust-conversion-webhook): see fieldCheck.
	TrustWebhook bool
	// DryRun says what Prepare would do, and changes nothing.
	DryRun bool
	// Ahead also migrates a CRD whose apply passes but keeps listing old
	// versions in status.storedVersions (Verdict.Ahead), where the apply
	// keeps the live storage version: a later release that drops one
	// passes then.
	Ahead bool
	// Migrate migrates every object of CRD name to target and prunes
	// status.storedVersions to it.
	Migrate func(ctx context.Context, name, target string) error
	// Report shows what Prepare does, as it does it.
	Report Reporter
}

// Reporter shows what Prepare does to each CRD.
type Reporter interface {
	// Did says what was done to crd, or what its outcome is.
	Did(crd, what string)
	// Warn says what the user should know that changes nothing.
	Warn(crd, warning string)
}

// ErrBlocked marks an error after which the CRD's apply stays refused and
// prepare cannot let it through; ErrPending one after which the migration
// ran but the apply is still refused. Test with errors.Is.
var (
	ErrBlocked = errors.New("blocked")
	ErrPending = errors.New("pending")
)

// stopped is an error of kind ErrBlocked or ErrPending, said as err alone.
type stopped struct{ kind, err error }

func (s *stopped) Error() string   { return s.err.Error() }
func (s *stopped) Unwrap() []error { return []error{s.kind, s.err} }

// Prepare judges m, migrates its CRD if it needs prepare, and judges it
// again; it returns the state judged first. A CRD that is blocked is left
// as it is, and is no error.
func (p *Preparer) Prepare(ctx context.Context, m Manifest) (State, error) {
	v, err := p.Check(ctx, m)
	if err != nil {
		return "", err
	}
	ahead := p.Ahead && v.State == OK && v.AheadNow
	switch {
	case v.State == NeedsPrepare && v.Unchecked != "":
		return v.State, fmt.Errorf("%s; nothing was changed", v.Unchecked)
	case p.leftAsIs(v, ahead):
		return v.State, nil
	}
	for _, warning := range v.Warnings {
		if !ahead {
			p.Report.Warn(v.CRD, warning)
		}
	}
	target := v.Storage
	if v.Bridge != "" {
		target = v.Bridge
		if state, err := p.toBridge(ctx, m.Name, v); err != nil {
			return state, err
		}
	}
	if err := p.Migrate(ctx, m.Name, target); err != nil {
		if v.Bridge != "" {
			err = fmt.Errorf("%w; the live storage version is now %s, every stored version is still listed, and nothing is lost: run prepare again, or apply the release that is installed to move it back", err, v.Bridge)
		}
		return v.State, errors.Join(err, p.flippedBack(ctx, m.Name, target))
	}
	after, err := p.Check(ctx, m)
	if err != nil {
		return v.State, err
	}
	switch {
	case after.State != OK:
		return v.State, &stopped{ErrPending, fmt.Errorf("after the migration it is still %s: %s", after.State, after.Reason)}
	case ahead && len(after.Ahead) > 0:
		return v.State, &stopped{ErrPending, fmt.Errorf("after the migration status.storedVersions still lists %s besides %s", strings.Join(after.Ahead, ", "), target)}
	}
	p.Report.Did(v.CRD, fmt.Sprintf("prepared: status.storedVersions lists %s alone; the apply passes (server-side dry run: %s)", target, dryRunSaid(after.DryRun)))
	return v.State, nil
}

// leftAsIs reports a verdict after which Prepare changes nothing (blocked,
// no prepare needed, or a dry run), and says so; ahead says that the CRD
// is prepared ahead of a later release (Preparer.Ahead).
func (p *Preparer) leftAsIs(v Verdict, ahead bool) bool {
	drops := v.Drops
	if ahead {
		drops = v.Ahead
	}
	switch {
	case v.State == Blocked:
		p.Report.Did(v.CRD, "blocked, left as it is: "+v.Reason)
	case v.State != NeedsPrepare && !ahead:
		p.Report.Did(v.CRD, fmt.Sprintf("%s, nothing to prepare: %s", v.State, v.Reason))
		for _, warning := range v.Warnings {
			p.Report.Warn(v.CRD, warning)
		}
	case p.DryRun && v.Bridge != "":
		p.Report.Did(v.CRD, fmt.Sprintf("would make %s the live storage version (no field of any object is lost at it: checked), migrate every object to it and prune status.storedVersions to [%s] (dry run: nothing changed)", v.Bridge, v.Bridge))
	case p.DryRun:
		p.Report.Did(v.CRD, fmt.Sprintf("would migrate every object to %s and prune %v from status.storedVersions (dry run: nothing changed)", v.Storage, drops))
	default:
		return false
	}
	return true
}

// dryRunSaid is what a verdict's dry run said, or why none was made.
func dryRunSaid(dryRun string) string {
	if dryRun == "" {
		return "none: --keep gives versions, not a manifest"
	}
	return dryRun
}
