// nvidia-requestor runs NVIDIA's driver upgrade library (github.com/NVIDIA/k8s-operator-libs,
// pkg/upgrade) in requestor mode, as NVIDIA's GPU and network operators do, against whatever
// cluster KUBECONFIG names: the end-to-end test tests/e2e/nvidia_requestor.rs points it at our
// operator. The library is used unchanged; this program only supplies what an operator's
// reconcile loop would: a driver name, the driver DaemonSet's namespace and labels, an upgrade
// policy, and a BuildState/ApplyState call every interval.
//
// Requestor mode is configured from the environment, as GetRequestorOptsFromEnvs reads it
// (pkg/upgrade/upgrade_requestor.go): MAINTENANCE_OPERATOR_ENABLED=true,
// MAINTENANCE_OPERATOR_REQUESTOR_ID, MAINTENANCE_OPERATOR_REQUESTOR_NAMESPACE and
// MAINTENANCE_OPERATOR_NODE_MAINTENANCE_PREFIX. Requests are shared between requestors through
// spec.additionalRequestors only under the default prefix, "nvidia-operator"
// (createOrUpdateNodeMaintenance in the same file).
//
// It prints one JSON line per interval with the number of nodes in each upgrade state (the node
// label nvidia.com/<driver>-driver-upgrade-state, pkg/upgrade/consts.go), and a last line with
// the outcome and the elapsed time. It exits 0 once every node of the DaemonSet is upgrade-done
// and no NodeMaintenance names this requestor, or once every node has stayed upgrade-done for
// --settle rounds with requests left ("outcome":"done-requests-left": the library releases a
// request once, after labelling the node upgrade-done, and never retries a release that
// failed); 1 on the deadline.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	maintenancev1alpha1 "github.com/Mellanox/maintenance-operator/api/v1alpha1"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/NVIDIA/k8s-operator-libs/api/upgrade/v1alpha1"
	"github.com/NVIDIA/k8s-operator-libs/pkg/upgrade"
)

// line is what the program prints, one JSON object per line.
type line struct {
	Requestor string         `json:"requestor"`
	Elapsed   float64        `json:"elapsedSeconds"`
	States    map[string]int `json:"states"`
	// Requests of this requestor that exist (owned or shared through additionalRequestors).
	Requests int    `json:"requests"`
	Error    string `json:"error,omitempty"`
	Outcome  string `json:"outcome,omitempty"`
}

func main() {
	driver := flag.String("driver", "gpu", "driver name: the node label is nvidia.com/<driver>-driver-upgrade-state")
	namespace := flag.String("namespace", "", "namespace of the driver DaemonSet and its pods")
	labels := flag.String("labels", "", "labels of the driver DaemonSet and its pods, k=v[,k=v...]")
	maxParallel := flag.Int("max-parallel-upgrades", 0,
		"the policy's maxParallelUpgrades (requestor mode leaves throttling to the maintenance operator)")
	drainTimeout := flag.Int("drain-timeout-seconds", 300, "the policy's drain.timeoutSeconds")
	interval := flag.Duration("interval", time.Second, "time between two BuildState/ApplyState rounds")
	deadline := flag.Duration("deadline", 10*time.Minute, "give up after this long")
	settle := flag.Int("settle", 5, "rounds every node stays upgrade-done before requests left are reported, not waited for")
	verbose := flag.Bool("v", false, "print the library's log to stderr")
	flag.Parse()

	selector, err := parseLabels(*labels)
	if err != nil || *namespace == "" {
		fmt.Fprintln(os.Stderr, "nvidia-requestor: --namespace and --labels k=v[,k=v...] are required")
		os.Exit(2)
	}
	opts := upgrade.GetRequestorOptsFromEnvs()
	if !opts.UseMaintenanceOperator || opts.MaintenanceOPRequestorID == "" {
		fmt.Fprintln(os.Stderr, "nvidia-requestor: set MAINTENANCE_OPERATOR_ENABLED=true and MAINTENANCE_OPERATOR_REQUESTOR_ID")
		os.Exit(2)
	}
	if err := run(*driver, *namespace, selector, opts, policy(*maxParallel, *drainTimeout), *interval, *deadline, *settle, *verbose); err != nil {
		fmt.Fprintln(os.Stderr, "nvidia-requestor:", err)
		os.Exit(1)
	}
}

// policy is the upgrade policy a ClusterPolicy (GPU operator) or NicClusterPolicy (network
// operator) carries: automatic upgrades, with a drain (pkg/upgrade/upgrade_requestor.go,
// convertV1Alpha1ToMaintenance, turns it into the request's drainSpec).
func policy(maxParallel, drainTimeout int) *v1alpha1.DriverUpgradePolicySpec {
	return &v1alpha1.DriverUpgradePolicySpec{
		AutoUpgrade:         true,
		MaxParallelUpgrades: maxParallel,
		DrainSpec: &v1alpha1.DrainSpec{
			Enable:         true,
			TimeoutSecond:  drainTimeout,
			DeleteEmptyDir: true,
		},
	}
}

func run(driver, namespace string, selector map[string]string, opts upgrade.RequestorOptions,
	policy *v1alpha1.DriverUpgradePolicySpec, interval, deadline time.Duration, settle int, verbose bool) error {
	// As an operator built on controller-runtime loads it: KUBECONFIG, and client-side rate
	// limits of 20 requests a second, bursts of 30.
	config, err := ctrlconfig.GetConfig()
	if err != nil {
		return fmt.Errorf("loading KUBECONFIG: %w", err)
	}
	log := logr.Discard()
	if verbose {
		log = funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{})
	}
	// The driver name is a package global of the library (pkg/upgrade/util.go, SetDriverName).
	upgrade.SetDriverName(driver)
	manager, err := upgrade.NewClusterUpgradeStateManager(log, config, nil, upgrade.StateOptions{Requestor: opts})
	if err != nil {
		return err
	}
	// A client of our own, only to count nodes by state and this requestor's requests.
	reader, err := client.New(config, client.Options{Scheme: upgrade.Scheme})
	if err != nil {
		return err
	}

	ctx := context.Background()
	started := time.Now()
	out := json.NewEncoder(os.Stdout)
	doneRounds := 0
	for {
		report := line{Requestor: opts.MaintenanceOPRequestorID, States: map[string]int{}}
		state, err := manager.BuildState(ctx, namespace, selector)
		if err == nil {
			err = manager.ApplyState(ctx, state, policy)
		}
		if err != nil {
			// An operator's reconcile would return the error and be retried: so do we.
			report.Error = err.Error()
		}
		// The states as the nodes show them after this round.
		nodes := 0
		if state != nil {
			for _, states := range state.NodeStates {
				nodes += len(states)
			}
		}
		if err := countStates(ctx, reader, report.States); err != nil && report.Error == "" {
			report.Error = err.Error()
		}
		report.Requests, err = countRequests(ctx, reader, opts)
		if err != nil && report.Error == "" {
			report.Error = err.Error()
		}
		report.Elapsed = time.Since(started).Seconds()
		allDone := nodes > 0 && report.States[upgrade.UpgradeStateDone] == nodes
		if allDone {
			doneRounds++
		} else {
			doneRounds = 0
		}
		if allDone && report.Requests == 0 && report.Error == "" {
			report.Outcome = "done"
		} else if doneRounds > settle {
			report.Outcome = "done-requests-left"
		} else if time.Since(started) > deadline {
			report.Outcome = "deadline"
		}
		if err := out.Encode(report); err != nil {
			return err
		}
		switch report.Outcome {
		case "done", "done-requests-left":
			return nil
		case "deadline":
			return fmt.Errorf("not every node upgrade-done after %s", deadline)
		}
		time.Sleep(interval)
	}
}

// countStates counts the nodes by the value of this driver's state label.
func countStates(ctx context.Context, reader client.Client, states map[string]int) error {
	var list corev1.NodeList
	if err := reader.List(ctx, &list, client.HasLabels{upgrade.GetUpgradeStateLabelKey()}); err != nil {
		return err
	}
	for _, node := range list.Items {
		states[node.Labels[upgrade.GetUpgradeStateLabelKey()]]++
	}
	return nil
}

// countRequests counts the NodeMaintenances in the requestor namespace that name this requestor,
// as owner or in additionalRequestors (the library's NewRequestorIDPredicate selects the same).
func countRequests(ctx context.Context, reader client.Client, opts upgrade.RequestorOptions) (int, error) {
	var list maintenancev1alpha1.NodeMaintenanceList
	if err := reader.List(ctx, &list, client.InNamespace(opts.MaintenanceOPRequestorNS)); err != nil {
		return 0, err
	}
	n := 0
	for _, nm := range list.Items {
		id := opts.MaintenanceOPRequestorID
		if nm.Spec.RequestorID == id || slices.Contains(nm.Spec.AdditionalRequestors, id) {
			n++
		}
	}
	return n, nil
}

func parseLabels(s string) (map[string]string, error) {
	labels := map[string]string{}
	for _, pair := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(pair, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("bad label %q", pair)
		}
		labels[k] = v
	}
	return labels, nil
}
