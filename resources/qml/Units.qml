// Units: how numbers read in the window ("1.2 GiB", "340 MiB/s").
pragma Singleton
import QtQml

QtObject {
    function bytes(value: double): string {
        const kib = 1024, mib = kib * 1024, gib = mib * 1024
        if (value >= gib) return (value / gib).toFixed(value >= 100 * gib ? 0 : 1) + " GiB"
        if (value >= mib) return (value / mib).toFixed(value >= 100 * mib ? 0 : 1) + " MiB"
        if (value >= kib) return (value / kib).toFixed(0) + " KiB"
        return Math.max(0, Math.round(value)) + " B"
    }
}
