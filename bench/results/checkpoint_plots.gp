set terminal pngcairo size 900,600 noenhanced
set output 'bench/results/checkpoint_memory.png'
set title 'Residual MLP (d=128, batch 64): measured peak activation vs depth N'
set xlabel 'layers N'
set ylabel 'peak activation (MiB)'
set logscale xy 2
set xtics (8, 16, 32, 64)
set xrange [7:72]
set key top left
set grid
set datafile missing '?'
plot 'bench/results/checkpoint_memory.dat' u 1:2 w lp lw 2 t 'none()', \
     '' u 1:3 w lp lw 2 t 'every(sqrt N)', \
     '' u 1:4 w lp lw 2 t 'every(2)', \
     '' u 1:5 w lp lw 2 t 'every(8)', \
     '' u 1:6 w lp lw 2 t 'selective{softmax,gelu,dropout}', \
     '' u 1:7 w lp lw 2 t 'budget(none/2)', \
     '' u 1:8 w lp dt 2 t 'PyTorch none', \
     '' u 1:9 w lp dt 2 t 'PyTorch every(sqrt N)'
set output 'bench/results/checkpoint_budget.png'
unset logscale
set xtics auto
set xrange [0:*]
set yrange [0.8:*]
set title 'Residual MLP N=64: step time vs activation budget (relative to none(); dots: every(k) at their peak)'
set xlabel 'budget (MiB)'
set ylabel 'step time / none() step time'
set key top right
set label "none()" at 18.469,1.0000 point pt 7 offset -1,-1 right font ',9'
set label "every(sqrt N=8)" at 2.938,1.3418 point pt 7 offset -1,-1 right font ',9'
set label "every(2)" at 2.000,1.3180 point pt 7 offset -1,-1 right font ',9'
plot 'bench/results/checkpoint_budget.dat' u 1:2 w lp lw 2 pt 7 t 'budget(b): measured (median of per-round ratios)', \
     '' u 1:2:5:6 w yerrorbars lc 1 pt 0 t 'quartiles of the per-round ratios', \
     '' u 1:3 w lp lw 2 dt 2 t 'predicted: none + recompute FLOPs / forward FLOP rate'
